/* strata: the cuda device's ops (strata/cuda_ops.h), except attention
 * (attention.cu). The cpu kernels (src/backend/cpu/kernels.c) are the
 * reference for every op's semantics. Every CUDA/cuBLAS status is checked
 * and turned into -errno; the native message is kept in st_error_last().
 *
 * Reductions are deterministic: no float atomics anywhere. Column sums over
 * rows (matmul dbias, layernorm dweight/dbias) go in two passes (partial
 * sums over fixed row chunks, then the chunks in order); the embedding's
 * scatter-add by token gives each distinct token to one thread block, which
 * adds that token's rows in position order (the cpu kernel's order).
 *
 * No relocatable device code: the static library is linked into C
 * programs by the C linker. */
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

extern "C" {
#include "strata/cuda_ops.h"
}
#include "cuda_internal.h"

#define ST_CUDA_WORKSPACE_BYTES ((size_t)32 << 20) /* cuBLASLt workspace */
#define ST_CUDA_MAX_GRID 65535                      /* grid-stride loops beyond */
#define ST_CUDA_ELEM_BLOCK 256                      /* threads, elementwise ops */
#define ST_CUDA_ROW_BLOCK 256                       /* threads, warp-per-row ops */
#define ST_CUDA_CE_BLOCK 512                        /* threads, block-per-row ops */
#define ST_CUDA_COL_TILE 32                         /* columns per colsum block */
#define ST_CUDA_COL_LANES 8                         /* row lanes per colsum block */
#define ST_CUDA_COL_CHUNK 256                       /* rows per colsum partial */
#define ST_CUDA_EMB_BLOCK 256                       /* threads, embedding scatter */

struct st_cuda_ctx {
	int ordinal;
	cudaStream_t stream;
	cublasLtHandle_t lt;
	void *workspace;
	size_t workspace_bytes;
	void *scratch; /* partial sums of the two-pass reductions */
	size_t scratch_bytes;
};

/* For the other op files (cuda_internal.h): C++ linkage, not public. */
cudaStream_t st_cuda_ctx_stream(struct st_cuda_ctx *ctx)
{
	return ctx->stream;
}

/* ---- errors ---------------------------------------------------------------- */

static int cuda_err(cudaError_t e, const char *what)
{
	int err;

	switch (e) {
	case cudaErrorMemoryAllocation: err = -ENOMEM; break;
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
	case cudaErrorInvalidDevice: err = -ENODEV; break;
	case cudaErrorInvalidValue: err = -EINVAL; break;
	default: err = -EIO; break;
	}
	cudaGetLastError(); /* clear the non-sticky error state */
	return st_error_set(err, "cuda: %s: %s (%s)", what, cudaGetErrorString(e),
			    cudaGetErrorName(e));
}

static int cublas_err(cublasStatus_t s, const char *what)
{
	int err;

	switch (s) {
	case CUBLAS_STATUS_ALLOC_FAILED: err = -ENOMEM; break;
	case CUBLAS_STATUS_NOT_INITIALIZED:
	case CUBLAS_STATUS_ARCH_MISMATCH: err = -ENODEV; break;
	case CUBLAS_STATUS_INVALID_VALUE: err = -EINVAL; break;
	case CUBLAS_STATUS_NOT_SUPPORTED: err = -ENOTSUP; break;
	default: err = -EIO; break;
	}
	return st_error_set(err, "cublasLt: %s: %s (%s)", what, cublasLtGetStatusString(s),
			    cublasLtGetStatusName(s));
}

#define CU_CHECK(call, what)                              \
	do {                                              \
		cudaError_t e_ = (call);                  \
		if (e_ != cudaSuccess)                    \
			return cuda_err(e_, what);        \
	} while (0)

/* After a kernel launch: a bad configuration shows up here. */
#define LAUNCH_CHECK(what) CU_CHECK(cudaGetLastError(), what)

/* Inside functions that clean up: set rc and jump to out. */
#define LT_CHECK(call, what)                              \
	do {                                              \
		cublasStatus_t s_ = (call);               \
		if (s_ != CUBLAS_STATUS_SUCCESS) {        \
			rc = cublas_err(s_, what);        \
			goto out;                         \
		}                                         \
	} while (0)

/* Every op starts here: a context, the right current device (a launch goes
 * to the current device, the stream belongs to the context's). */
static int ctx_enter(struct st_cuda_ctx *ctx)
{
	if (!ctx)
		return st_error_set(-EINVAL, "cuda: no context");
	CU_CHECK(cudaSetDevice(ctx->ordinal), "cudaSetDevice");
	return 0;
}

static unsigned grid_for(size_t n_items, unsigned per_block)
{
	size_t g = (n_items + per_block - 1) / per_block;
	if (g > ST_CUDA_MAX_GRID)
		g = ST_CUDA_MAX_GRID;
	return (unsigned)(g ? g : 1);
}

/* At least `bytes` of scratch on the context's device. Growing waits for
 * the stream: queued work may still read the old buffer. */
static int scratch_get(struct st_cuda_ctx *ctx, size_t bytes, void **out)
{
	if (ctx->scratch_bytes < bytes) {
		size_t want = st_align_up(bytes, (size_t)1 << 20);
		CU_CHECK(cudaStreamSynchronize(ctx->stream), "cudaStreamSynchronize");
		if (ctx->scratch)
			cudaFree(ctx->scratch);
		ctx->scratch = NULL;
		ctx->scratch_bytes = 0;
		CU_CHECK(cudaMalloc(&ctx->scratch, want), "cudaMalloc(scratch)");
		ctx->scratch_bytes = want;
	}
	*out = ctx->scratch;
	return 0;
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
 * in order. With inp == NULL it is a plain column sum of g. */
static __global__ void k_colsum_partial(float *partial, float *partial2, const float *g,
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
				float gv = g[(size_t)r * C + c];
				acc += gv;
				if (inp)
					acc2 += gv * ((inp[(size_t)r * C + c] - mean[r]) * rstd[r]);
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

/* out1 (C) += column sums of g (N,C); out2 (C) += column sums of
 * g * (inp - mean) * rstd when inp is given. Either output may be NULL. */
static int colsum(struct st_cuda_ctx *ctx, float *out1, float *out2, const float *g,
		  const float *inp, const float *mean, const float *rstd, int N, int C)
{
	if (N == 0 || C == 0 || (!out1 && !out2))
		return 0;
	int n_chunks = (N + ST_CUDA_COL_CHUNK - 1) / ST_CUDA_COL_CHUNK;
	size_t part_elems = (size_t)n_chunks * C;
	void *scratch = NULL;
	int rc = scratch_get(ctx, 2 * part_elems * sizeof(float), &scratch);
	if (rc)
		return rc;
	float *p1 = (float *)scratch, *p2 = p1 + part_elems;
	dim3 block(ST_CUDA_COL_TILE, ST_CUDA_COL_LANES);
	dim3 grid((unsigned)((C + ST_CUDA_COL_TILE - 1) / ST_CUDA_COL_TILE),
		  (unsigned)ST_MIN(n_chunks, ST_CUDA_MAX_GRID));
	k_colsum_partial<<<grid, block, 0, ctx->stream>>>(p1, inp ? p2 : NULL, g, inp, mean,
							  rstd, N, C, n_chunks);
	LAUNCH_CHECK("colsum partial");
	unsigned fg = grid_for((size_t)C, ST_CUDA_ELEM_BLOCK);
	if (out1) {
		k_colsum_final<<<fg, ST_CUDA_ELEM_BLOCK, 0, ctx->stream>>>(out1, p1, C, n_chunks);
		LAUNCH_CHECK("colsum final");
	}
	if (out2 && inp) {
		k_colsum_final<<<fg, ST_CUDA_ELEM_BLOCK, 0, ctx->stream>>>(out2, p2, C, n_chunks);
		LAUNCH_CHECK("colsum final");
	}
	return 0;
}

/* ---- layernorm (a warp per row) ---------------------------------------------- */

static __global__ void k_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp,
				       const float *weight, const float *bias, int N, int C)
{
	int lane = threadIdx.x & 31;
	int wpb = blockDim.x >> 5;
	for (int n = blockIdx.x * wpb + (threadIdx.x >> 5); n < N; n += gridDim.x * wpb) {
		const float *x = inp + (size_t)n * C;
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

/* ---- cuBLASLt ------------------------------------------------------------------- */

/* Largest power of two (<= 256) dividing the address: cuBLASLt assumes 256
 * unless told, and our pointers may be offsets into an arena. */
static uint32_t ptr_align(const void *p)
{
	uintptr_t u = (uintptr_t)p;
	uint32_t a = 256;
	while (a > 1 && (u & (a - 1)))
		a >>= 1;
	return a;
}

/* Column-major D (m,n) = op(A) @ op(B) + beta * D (+ bias (m) per column
 * with bias non-NULL). A is stored (m,k) or, transposed, (k,m); B (k,n) or
 * (n,k); leading dimensions as stored. D and bias fp32; A and B of type
 * ab. -ENOTSUP when cuBLASLt has no algorithm for it. */
static int lt_matmul(struct st_cuda_ctx *ctx, cublasOperation_t ta, cublasOperation_t tb,
		     uint64_t m, uint64_t n, uint64_t k, const void *A, int64_t lda,
		     const void *B, int64_t ldb, cudaDataType_t ab, float *D, int64_t ldd,
		     float beta, const float *bias)
{
	cublasLtMatmulDesc_t op = NULL;
	cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
	cublasLtMatmulPreference_t pref = NULL;
	cublasLtMatmulHeuristicResult_t heur;
	int returned = 0, rc = 0;
	float alpha = 1.0f;
	uint64_t ws_bytes = ctx->workspace_bytes;
	uint32_t al_a = ptr_align(A), al_b = ptr_align(B), al_d = ptr_align(D);
	cublasStatus_t hs;

	LT_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
		 "cublasLtMatmulDescCreate");
	LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
		 "set TRANSA");
	LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
		 "set TRANSB");
	if (bias) {
		cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
		int32_t bias_type = CUDA_R_32F;
		LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
							sizeof(epi)),
			 "set EPILOGUE");
		LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
							&bias, sizeof(bias)),
			 "set BIAS_POINTER");
		LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
							&bias_type, sizeof(bias_type)),
			 "set BIAS_DATA_TYPE");
	}
	LT_CHECK(cublasLtMatrixLayoutCreate(&la, ab, ta == CUBLAS_OP_N ? m : k,
					    ta == CUBLAS_OP_N ? k : m, lda),
		 "layout A");
	LT_CHECK(cublasLtMatrixLayoutCreate(&lb, ab, tb == CUBLAS_OP_N ? k : n,
					    tb == CUBLAS_OP_N ? n : k, ldb),
		 "layout B");
	LT_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, ldd), "layout D");
	LT_CHECK(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
	LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref,
						      CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
						      &ws_bytes, sizeof(ws_bytes)),
		 "set MAX_WORKSPACE_BYTES");
	LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref,
						      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
						      &al_a, sizeof(al_a)),
		 "set MIN_ALIGNMENT_A");
	LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref,
						      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
						      &al_b, sizeof(al_b)),
		 "set MIN_ALIGNMENT_B");
	LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref,
						      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
						      &al_d, sizeof(al_d)),
		 "set MIN_ALIGNMENT_C");
	LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref,
						      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
						      &al_d, sizeof(al_d)),
		 "set MIN_ALIGNMENT_D");
	hs = cublasLtMatmulAlgoGetHeuristic(ctx->lt, op, la, lb, ld, ld, pref, 1, &heur,
					    &returned);
	if (hs == CUBLAS_STATUS_NOT_SUPPORTED || (hs == CUBLAS_STATUS_SUCCESS && returned == 0)) {
		rc = st_error_set(-ENOTSUP,
				  "cublasLt: no algorithm for m=%llu n=%llu k=%llu%s (%s)",
				  (unsigned long long)m, (unsigned long long)n,
				  (unsigned long long)k, bias ? " with bias" : "",
				  cublasLtGetStatusString(hs));
		goto out;
	}
	LT_CHECK(hs, "cublasLtMatmulAlgoGetHeuristic");
	LT_CHECK(cublasLtMatmul(ctx->lt, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld,
				&heur.algo, ctx->workspace, ctx->workspace_bytes, ctx->stream),
		 "cublasLtMatmul");
out:
	if (pref)
		cublasLtMatmulPreferenceDestroy(pref);
	if (ld)
		cublasLtMatrixLayoutDestroy(ld);
	if (lb)
		cublasLtMatrixLayoutDestroy(lb);
	if (la)
		cublasLtMatrixLayoutDestroy(la);
	if (op)
		cublasLtMatmulDescDestroy(op);
	return rc;
}

/* ---- public: context and memory ------------------------------------------------ */

extern "C" {

int st_cuda_available(void)
{
	int count = 0;

	if (cudaGetDeviceCount(&count) != cudaSuccess) {
		cudaGetLastError();
		return 0;
	}
	return count > 0;
}

int st_cuda_ctx_create(int ordinal, struct st_cuda_ctx **out)
{
	struct st_cuda_ctx *ctx;
	int count = 0, rc = 0;
	cudaError_t e;
	cublasStatus_t s;

	*out = NULL;
	e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess) { /* no driver, no device: no usable GPU */
		cudaGetLastError();
		return st_error_set(-ENODEV, "cuda: no usable GPU: %s (%s)",
				    cudaGetErrorString(e), cudaGetErrorName(e));
	}
	if (ordinal < 0 || ordinal >= count)
		return st_error_set(-ENODEV, "cuda: no GPU %d (%d present)", ordinal, count);
	ctx = (struct st_cuda_ctx *)calloc(1, sizeof(*ctx));
	if (!ctx)
		return st_error_set(-ENOMEM, "cuda: context");
	ctx->ordinal = ordinal;
	e = cudaSetDevice(ordinal);
	if (e != cudaSuccess) {
		rc = cuda_err(e, "cudaSetDevice");
		goto fail;
	}
	e = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking);
	if (e != cudaSuccess) {
		ctx->stream = NULL;
		rc = cuda_err(e, "cudaStreamCreate");
		goto fail;
	}
	s = cublasLtCreate(&ctx->lt);
	if (s != CUBLAS_STATUS_SUCCESS) {
		ctx->lt = NULL;
		rc = cublas_err(s, "cublasLtCreate");
		goto fail;
	}
	e = cudaMalloc(&ctx->workspace, ST_CUDA_WORKSPACE_BYTES);
	if (e != cudaSuccess) {
		ctx->workspace = NULL;
		rc = cuda_err(e, "cudaMalloc(cublasLt workspace)");
		goto fail;
	}
	ctx->workspace_bytes = ST_CUDA_WORKSPACE_BYTES;
	*out = ctx;
	return 0;
fail:
	st_cuda_ctx_destroy(ctx);
	return rc;
}

void st_cuda_ctx_destroy(struct st_cuda_ctx *ctx)
{
	if (!ctx)
		return;
	cudaSetDevice(ctx->ordinal);
	if (ctx->stream)
		cudaStreamSynchronize(ctx->stream);
	if (ctx->scratch)
		cudaFree(ctx->scratch);
	if (ctx->workspace)
		cudaFree(ctx->workspace);
	if (ctx->lt)
		cublasLtDestroy(ctx->lt);
	if (ctx->stream)
		cudaStreamDestroy(ctx->stream);
	cudaGetLastError();
	free(ctx);
}

int st_cuda_sync(struct st_cuda_ctx *ctx)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	CU_CHECK(cudaStreamSynchronize(ctx->stream), "cudaStreamSynchronize");
	return 0;
}

int st_cuda_alloc(void **ptr, size_t bytes)
{
	*ptr = NULL;
	if (bytes == 0)
		return 0;
	CU_CHECK(cudaMalloc(ptr, bytes), "cudaMalloc");
	return 0;
}

void st_cuda_free(void *ptr)
{
	if (ptr && cudaFree(ptr) != cudaSuccess)
		cudaGetLastError();
}

/* The copies and memset run on the legacy stream, which does not order
 * against the contexts' non-blocking streams: wait for the whole device
 * before and after, so these helpers never race queued ops. */
int st_cuda_h2d(void *dst, const void *src, size_t bytes)
{
	if (bytes == 0)
		return 0;
	CU_CHECK(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
	CU_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy(h2d)");
	CU_CHECK(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
	return 0;
}

int st_cuda_d2h(void *dst, const void *src, size_t bytes)
{
	if (bytes == 0)
		return 0;
	CU_CHECK(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
	CU_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy(d2h)");
	return 0;
}

int st_cuda_memset(void *ptr, int value, size_t bytes)
{
	if (bytes == 0)
		return 0;
	CU_CHECK(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
	CU_CHECK(cudaMemset(ptr, value, bytes), "cudaMemset");
	CU_CHECK(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
	return 0;
}

/* ---- public: casts ----------------------------------------------------------------- */

int st_cuda_bf16_to_f32(struct st_cuda_ctx *ctx, float *out, const uint16_t *in, size_t n)
{
	int rc = ctx_enter(ctx);
	if (rc || n == 0)
		return rc;
	k_bf16_to_f32<<<grid_for(n, ST_CUDA_ELEM_BLOCK), ST_CUDA_ELEM_BLOCK, 0, ctx->stream>>>(
		out, in, n);
	LAUNCH_CHECK("bf16_to_f32");
	return 0;
}

int st_cuda_f32_to_bf16(struct st_cuda_ctx *ctx, uint16_t *out, const float *in, size_t n)
{
	int rc = ctx_enter(ctx);
	if (rc || n == 0)
		return rc;
	k_f32_to_bf16<<<grid_for(n, ST_CUDA_ELEM_BLOCK), ST_CUDA_ELEM_BLOCK, 0, ctx->stream>>>(
		out, in, n);
	LAUNCH_CHECK("f32_to_bf16");
	return 0;
}

/* ---- public: matmul ----------------------------------------------------------------- */

/* Row-major X (r,c) is column-major X^T (c,r) with ld = c. So
 * out^T (OC,N) = W^T (OC,IC) @ inp^T (IC,N): A = weight as stored (OC,IC)
 * ld OC, B = inp as stored (IC,N) ld IC, D (OC,N) ld OC, no transposes;
 * the bias (OC) runs along D's rows, which is what EPILOGUE_BIAS adds. */
int st_cuda_matmul_fwd(struct st_cuda_ctx *ctx, float *out, const void *inp,
		       const void *weight, const float *bias, int N, int IC, int OC,
		       enum st_cuda_dtype dtype)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (N < 0 || IC < 0 || OC < 0 || (dtype != ST_CUDA_F32 && dtype != ST_CUDA_BF16))
		return st_error_set(-EINVAL, "cuda: matmul_fwd: bad shape or dtype");
	if (N == 0 || OC == 0)
		return 0;
	size_t n_out = (size_t)N * OC;
	if (IC == 0) { /* empty sum: out = bias (or 0) */
		k_fill_rows<<<grid_for(n_out, ST_CUDA_ELEM_BLOCK), ST_CUDA_ELEM_BLOCK, 0,
			      ctx->stream>>>(out, bias, (size_t)N, OC);
		LAUNCH_CHECK("matmul_fwd fill");
		return 0;
	}
	cudaDataType_t ab = dtype == ST_CUDA_BF16 ? CUDA_R_16BF : CUDA_R_32F;
	rc = lt_matmul(ctx, CUBLAS_OP_N, CUBLAS_OP_N, (uint64_t)OC, (uint64_t)N, (uint64_t)IC,
		       weight, OC, inp, IC, ab, out, OC, 0.0f, bias);
	if (rc == -ENOTSUP && bias) {
		/* No fused-bias algorithm for this case: rows = bias, then
		 * accumulate the product onto them. */
		k_fill_rows<<<grid_for(n_out, ST_CUDA_ELEM_BLOCK), ST_CUDA_ELEM_BLOCK, 0,
			      ctx->stream>>>(out, bias, (size_t)N, OC);
		LAUNCH_CHECK("matmul_fwd bias");
		rc = lt_matmul(ctx, CUBLAS_OP_N, CUBLAS_OP_N, (uint64_t)OC, (uint64_t)N,
			       (uint64_t)IC, weight, OC, inp, IC, ab, out, OC, 1.0f, NULL);
	}
	return rc;
}

/* dinp^T (IC,N) += W (IC,OC) @ dout^T (OC,N): A = weight as stored (OC,IC)
 * ld OC, transposed; B = dout as stored (OC,N) ld OC; D ld IC.
 * dweight^T (OC,IC) += dout^T (OC,N) @ inp (N,IC): A = dout as stored
 * (OC,N) ld OC; B = inp as stored (IC,N) ld IC, transposed; D ld OC. */
int st_cuda_matmul_bwd(struct st_cuda_ctx *ctx, float *dinp, float *dweight, float *dbias,
		       const float *dout, const float *inp, const float *weight, int N,
		       int IC, int OC)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (N < 0 || IC < 0 || OC < 0)
		return st_error_set(-EINVAL, "cuda: matmul_bwd: bad shape");
	if (dinp && N > 0 && IC > 0 && OC > 0) {
		rc = lt_matmul(ctx, CUBLAS_OP_T, CUBLAS_OP_N, (uint64_t)IC, (uint64_t)N,
			       (uint64_t)OC, weight, OC, dout, OC, CUDA_R_32F, dinp, IC, 1.0f,
			       NULL);
		if (rc)
			return rc;
	}
	if (dweight && N > 0 && IC > 0 && OC > 0) {
		rc = lt_matmul(ctx, CUBLAS_OP_N, CUBLAS_OP_T, (uint64_t)OC, (uint64_t)IC,
			       (uint64_t)N, dout, OC, inp, IC, CUDA_R_32F, dweight, OC, 1.0f,
			       NULL);
		if (rc)
			return rc;
	}
	if (dbias)
		return colsum(ctx, dbias, NULL, dout, NULL, NULL, NULL, N, OC);
	return 0;
}

/* ---- public: the rest ------------------------------------------------------------------ */

int st_cuda_layernorm_fwd(struct st_cuda_ctx *ctx, float *out, float *mean, float *rstd,
			  const float *inp, const float *weight, const float *bias, int N,
			  int C)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (N < 0 || C < 0)
		return st_error_set(-EINVAL, "cuda: layernorm_fwd: bad shape");
	if (N == 0 || C == 0)
		return 0;
	int wpb = ST_CUDA_ROW_BLOCK / 32;
	k_layernorm_fwd<<<grid_for((size_t)N, (unsigned)wpb), ST_CUDA_ROW_BLOCK, 0,
			  ctx->stream>>>(out, mean, rstd, inp, weight, bias, N, C);
	LAUNCH_CHECK("layernorm_fwd");
	return 0;
}

int st_cuda_layernorm_bwd(struct st_cuda_ctx *ctx, float *dinp, float *dweight,
			  float *dbias, const float *dout, const float *inp,
			  const float *weight, const float *mean, const float *rstd, int N,
			  int C)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (N < 0 || C < 0)
		return st_error_set(-EINVAL, "cuda: layernorm_bwd: bad shape");
	if (N == 0 || C == 0)
		return 0;
	if (dinp) {
		int wpb = ST_CUDA_ROW_BLOCK / 32;
		k_layernorm_bwd_dinp<<<grid_for((size_t)N, (unsigned)wpb), ST_CUDA_ROW_BLOCK, 0,
				       ctx->stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
		LAUNCH_CHECK("layernorm_bwd dinp");
	}
	if (dweight || dbias)
		return colsum(ctx, dbias, dweight, dout, inp, mean, rstd, N, C);
	return 0;
}

int st_cuda_gelu_fwd(struct st_cuda_ctx *ctx, float *out, const float *inp, size_t n)
{
	int rc = ctx_enter(ctx);
	if (rc || n == 0)
		return rc;
	k_gelu_fwd<<<grid_for(n, ST_CUDA_ELEM_BLOCK), ST_CUDA_ELEM_BLOCK, 0, ctx->stream>>>(
		out, inp, n);
	LAUNCH_CHECK("gelu_fwd");
	return 0;
}

int st_cuda_gelu_bwd(struct st_cuda_ctx *ctx, float *dinp, const float *inp,
		     const float *dout, size_t n)
{
	int rc = ctx_enter(ctx);
	if (rc || n == 0)
		return rc;
	k_gelu_bwd<<<grid_for(n, ST_CUDA_ELEM_BLOCK), ST_CUDA_ELEM_BLOCK, 0, ctx->stream>>>(
		dinp, inp, dout, n);
	LAUNCH_CHECK("gelu_bwd");
	return 0;
}

int st_cuda_residual_fwd(struct st_cuda_ctx *ctx, float *out, const float *a,
			 const float *b, size_t n)
{
	int rc = ctx_enter(ctx);
	if (rc || n == 0)
		return rc;
	k_residual_fwd<<<grid_for(n, ST_CUDA_ELEM_BLOCK), ST_CUDA_ELEM_BLOCK, 0, ctx->stream>>>(
		out, a, b, n);
	LAUNCH_CHECK("residual_fwd");
	return 0;
}

int st_cuda_residual_bwd(struct st_cuda_ctx *ctx, float *da, float *db, const float *dout,
			 size_t n)
{
	int rc = ctx_enter(ctx);
	if (rc || n == 0)
		return rc;
	k_residual_bwd<<<grid_for(n, ST_CUDA_ELEM_BLOCK), ST_CUDA_ELEM_BLOCK, 0, ctx->stream>>>(
		da, db, dout, n);
	LAUNCH_CHECK("residual_bwd");
	return 0;
}

int st_cuda_embedding_fwd(struct st_cuda_ctx *ctx, float *out, const int32_t *tokens,
			  const float *wte, const float *wpe, int B, int T, int C)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (B < 0 || T < 0 || C < 0)
		return st_error_set(-EINVAL, "cuda: embedding_fwd: bad shape");
	size_t n = (size_t)B * T * C;
	if (n == 0)
		return 0;
	k_embedding_fwd<<<grid_for(n, ST_CUDA_ELEM_BLOCK), ST_CUDA_ELEM_BLOCK, 0, ctx->stream>>>(
		out, tokens, wte, wpe, T, C, n);
	LAUNCH_CHECK("embedding_fwd");
	return 0;
}

int st_cuda_embedding_bwd(struct st_cuda_ctx *ctx, float *dwte, float *dwpe,
			  const float *dout, const int32_t *tokens, int B, int T, int C)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (B < 0 || T < 0 || C < 0)
		return st_error_set(-EINVAL, "cuda: embedding_bwd: bad shape");
	if ((size_t)B * T * C == 0)
		return 0;
	int BT = B * T;
	if (dwte) {
		k_embedding_bwd_wte<<<(unsigned)ST_MIN(BT, ST_CUDA_MAX_GRID), ST_CUDA_EMB_BLOCK, 0,
				      ctx->stream>>>(dwte, dout, tokens, BT, C);
		LAUNCH_CHECK("embedding_bwd wte");
	}
	if (dwpe) {
		k_embedding_bwd_wpe<<<grid_for((size_t)T * C, ST_CUDA_ELEM_BLOCK),
				      ST_CUDA_ELEM_BLOCK, 0, ctx->stream>>>(dwpe, dout, B, T, C);
		LAUNCH_CHECK("embedding_bwd wpe");
	}
	return 0;
}

int st_cuda_crossentropy_fwd(struct st_cuda_ctx *ctx, float *losses, const float *logits,
			     const int32_t *targets, int N, int V)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (N < 0 || V <= 0)
		return st_error_set(-EINVAL, "cuda: crossentropy_fwd: bad shape");
	if (N == 0)
		return 0;
	k_crossentropy_fwd<<<(unsigned)ST_MIN(N, ST_CUDA_MAX_GRID), ST_CUDA_CE_BLOCK, 0,
			     ctx->stream>>>(losses, logits, targets, N, V);
	LAUNCH_CHECK("crossentropy_fwd");
	return 0;
}

int st_cuda_crossentropy_bwd(struct st_cuda_ctx *ctx, float *dlogits, float *losses,
			     const float *logits, const int32_t *targets, float dloss, int N,
			     int V)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (N < 0 || V <= 0)
		return st_error_set(-EINVAL, "cuda: crossentropy_bwd: bad shape");
	if (N == 0)
		return 0;
	k_crossentropy_bwd<<<(unsigned)ST_MIN(N, ST_CUDA_MAX_GRID), ST_CUDA_CE_BLOCK, 0,
			     ctx->stream>>>(dlogits, losses, logits, targets, dloss, N, V);
	LAUNCH_CHECK("crossentropy_bwd");
	return 0;
}

} /* extern "C" */
