/* Device code of the cuda bf16 ops (bf16.cu holds the host code): the
 * elementwise and per-row kernels of the GPT-2 bf16 path with bf16 inputs
 * and outputs, fp32 arithmetic inside, each bf16 output rounded once to
 * nearest even, as the cpu reference (kernels_bf16.h) does. Included
 * after ops_kernels.cuh (its geometry, warp_sum, bf16_from_f32, the
 * ld_f/st_f I/O helpers, GELU constants), and compiled by tests/cuda/test_bf16_emu.cpp on the cpu
 * through tests/cuda/cuda_emu.h: only the builtins ops_kernels.cuh lists.
 *
 * The column sums (dbias of a bf16 dout, the norms' dweight and dbias) are
 * ops_kernels.cuh's two-pass k_colsum_partial / k_colsum_final over a bf16
 * or fp32 dout (st_cuda_colsum(), ops.cu), as the fp32 ops': one thread a
 * column over every row left about three blocks for 132 SMs at C = 768. */
#ifndef ST_CUDA_BF16_KERNELS_CUH
#define ST_CUDA_BF16_KERNELS_CUH

#include <stdint.h>

/* (bf16_f, ld_f and st_f: ops_kernels.cuh) */

/* out (N,OC) rows = bias (bf16), or 0: the matmul's start when cuBLASLt
 * has no fused-bias algorithm. */
template <typename TO>
static __global__ void k_fill_rows_b(TO *out, const uint16_t *bias, size_t N, int OC)
{
	size_t n = N * (size_t)OC;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		st_f(out, i, bias ? bf16_f(bias[i % (size_t)OC]) : 0.0f);
}

/* ---- layernorm: fp32 rows in, bf16 out, bf16 weight and bias ---------------- */

static __global__ void k_layernorm_fwd_b(uint16_t *out, float *mean, float *rstd,
					 const float *inp, const uint16_t *weight,
					 const uint16_t *bias, int N, int C)
{
	int lane = threadIdx.x & 31;
	int wpb = blockDim.x >> 5;
	for (int n = blockIdx.x * wpb + (threadIdx.x >> 5); n < N; n += gridDim.x * wpb) {
		const float *x = inp + (size_t)n * C;
		uint16_t *o = out + (size_t)n * C;
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
			o[c] = bf16_from_f32((x[c] - m) * r * bf16_f(weight[c]) + bf16_f(bias[c]));
		if (lane == 0) {
			mean[n] = m;
			rstd[n] = r;
		}
	}
}

/* dinp (N,C) fp32 += the layernorm's input gradient; dout bf16 or fp32 */
template <typename TD>
static __global__ void k_layernorm_bwd_dinp_b(float *dinp, const TD *dout, const float *inp,
					      const uint16_t *weight, const float *mean,
					      const float *rstd, int N, int C)
{
	int lane = threadIdx.x & 31;
	int wpb = blockDim.x >> 5;
	for (int n = blockIdx.x * wpb + (threadIdx.x >> 5); n < N; n += gridDim.x * wpb) {
		const float *x = inp + (size_t)n * C;
		const TD *g = dout + (size_t)n * C;
		float *dx = dinp + (size_t)n * C;
		float m = mean[n], r = rstd[n];
		float s_dn = 0.0f, s_dnn = 0.0f;
		for (int c = lane; c < C; c += 32) {
			float norm = (x[c] - m) * r;
			float dnorm = bf16_f(weight[c]) * ld_f(g, c);
			s_dn += dnorm;
			s_dnn += dnorm * norm;
		}
		s_dn = warp_sum(s_dn) / (float)C;
		s_dnn = warp_sum(s_dnn) / (float)C;
		for (int c = lane; c < C; c += 32) {
			float norm = (x[c] - m) * r;
			float dnorm = bf16_f(weight[c]) * ld_f(g, c);
			dx[c] += (dnorm - s_dn - norm * s_dnn) * r;
		}
	}
}

/* ---- GELU (GPT-2's tanh form, ops_kernels.cuh's arithmetic) ----------------- */

static __global__ void k_gelu_fwd_b(uint16_t *out, const uint16_t *inp, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float x = bf16_f(inp[i]);
		float e = gelu_e(x);
		float a = 1.0f / (e + 1.0f);
		out[i] = bf16_from_f32(x * (e * a));
	}
}

/* dinp = gelu'(inp) * dout, all bf16; dinp may be inp (in place) */
static __global__ void k_gelu_bwd_b(uint16_t *dinp, const uint16_t *inp, const uint16_t *dout,
				    size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float x = bf16_f(inp[i]);
		float e = gelu_e(x);
		float a = 1.0f / (e + 1.0f);
		float ea = e * a;
		float du = ST_GELU_K * (1.0f + 3.0f * ST_GELU_A * x * x);
		float g = ea + 2.0f * x * (ea * a) * du;
		dinp[i] = bf16_from_f32(g * bf16_f(dout[i]));
	}
}

/* ---- embedding: bf16 tables, fp32 rows out ------------------------------------ */

static __global__ void k_embedding_fwd_b(float *out, const int32_t *tokens, const uint16_t *wte,
					 const uint16_t *wpe, int T, int C, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		size_t bt = i / (size_t)C;
		int c = (int)(i % (size_t)C);
		int t = (int)(bt % (size_t)T);
		out[i] = bf16_f(wte[(size_t)tokens[bt] * C + c]) + bf16_f(wpe[(size_t)t * C + c]);
	}
}

#endif
