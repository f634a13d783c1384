/* Device code of the optimizer on the GPU (optim.cu holds the host code):
 * AdamW over fp32 G, P, M, V and the gradient's sum of squares, each
 * bit for bit the host's (src/optim, strata/optim.h's recipe). Kept apart,
 * like ops_kernels.cuh, so tests/cuda/test_optim_emu.cpp compiles these
 * exact kernels with a host C++ compiler (tests/cuda/cuda_emu.h) and holds
 * them to st_adam_apply() and st_grad_sumsq() on machines without a GPU.
 *
 * Bit identity: every step is one IEEE operation rounded to nearest, named
 * by its intrinsic (__fmul_rn, __fmaf_rn, __fsqrt_rn, __fdiv_rn, __fma_rn),
 * which nvcc never contracts or approximates whatever -fmad/-use_fast_math;
 * the host recipe's fmaf() is the single-rounding __fmaf_rn. The sum of
 * squares keeps the host's order: lane j of a chunk of 16384 sums elements
 * i = j mod 8 in increasing i (d*d is exact in fp64, so the fma is the
 * host's add), lanes fold as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), and the
 * chunks are added in index order by one thread. No atomics but the count
 * of non-finite elements (an integer: its value does not depend on order).
 *
 * Builtins used beyond ops_kernels.cuh's: __syncthreads, atomicAdd
 * (unsigned), __fmul_rn, __fmaf_rn, __fsqrt_rn, __fdiv_rn, __fma_rn; the
 * emulation has shims for each. */
#ifndef ST_CUDA_OPTIM_KERNELS_CUH
#define ST_CUDA_OPTIM_KERNELS_CUH

#include <stddef.h>
#include <stdint.h>

#define ST_OPT_BLOCK 256            /* threads, AdamW */
#define ST_OPT_GRID_MAX 65535
#define ST_GSQ_CHUNK 16384          /* = ST_GSTAT_CHUNK_ELEMS (src/optim) */
#define ST_GSQ_LANES 8              /* = ST_GSTAT_LANES */
#define ST_GSQ_BLOCK 256            /* threads: 32 chunks of 8 lanes */
#define ST_GSQ_CHUNKS_PER_BLOCK (ST_GSQ_BLOCK / ST_GSQ_LANES)

/* One chunk's partial sum in scratch (16 bytes, the op's layout). */
struct st_gsq_part {
	double sum;
	uint32_t absmax_bits, pad;
};

/* The AdamW constants (struct st_adam_step's floats, in its order). */
struct st_adamw_consts {
	float grad_scale, beta1, omb1, beta2, omb2, rsqrt_bc2, eps, neg_step, decay;
};

static inline unsigned opt_grid(size_t n)
{
	size_t g = (n + ST_OPT_BLOCK - 1) / ST_OPT_BLOCK;

	return (unsigned)(g == 0 ? 1 : g > ST_OPT_GRID_MAX ? ST_OPT_GRID_MAX : g);
}

static __device__ __forceinline__ size_t gsq_chunks_dev(size_t n)
{
	return (n + ST_GSQ_CHUNK - 1) / ST_GSQ_CHUNK;
}

static inline size_t gsq_chunks(size_t n)
{
	return (n + ST_GSQ_CHUNK - 1) / ST_GSQ_CHUNK;
}

static inline unsigned gsq_grid(size_t n)
{
	size_t g = (gsq_chunks(n) + ST_GSQ_CHUNKS_PER_BLOCK - 1) / ST_GSQ_CHUNKS_PER_BLOCK;

	return (unsigned)(g == 0 ? 1 : g > ST_OPT_GRID_MAX ? ST_OPT_GRID_MAX : g);
}

/* st_bf16_from_f32 (strata/optim.h): RNE, NaN kept quiet with its sign. */
static __device__ __forceinline__ uint16_t opt_bf16(float x)
{
	uint32_t u = __float_as_uint(x);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x0040u);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static __device__ __forceinline__ bool opt_finite(float x)
{
	return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u;
}

/* st_adam_elem() then W = round(P'), over n elements (grid-stride). W is
 * fp32 (w32), bf16 (w16) or none (both NULL). */
static __global__ void k_adamw(const float *g, float *p, float *m, float *v, float *w32,
			       uint16_t *w16, unsigned *bad, struct st_adamw_consts c,
			       size_t n)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float gs = __fmul_rn(g[i], c.grad_scale);
		float pn = p[i];

		if (opt_finite(gs)) {
			float mn = __fmaf_rn(c.beta1, m[i], __fmul_rn(c.omb1, gs));
			float vn = __fmaf_rn(c.beta2, v[i], __fmul_rn(__fmul_rn(c.omb2, gs), gs));
			float d = __fmaf_rn(__fsqrt_rn(vn), c.rsqrt_bc2, c.eps);

			pn = __fmaf_rn(c.neg_step, __fdiv_rn(mn, d), __fmul_rn(pn, c.decay));
			p[i] = pn;
			m[i] = mn;
			v[i] = vn;
		} else {
			atomicAdd(bad, 1u);
		}
		if (w32)
			w32[i] = pn;
		else if (w16)
			w16[i] = opt_bf16(pn);
	}
}

/* Pass 1: each chunk's lanes, folded, into parts[chunk]. Thread t of a
 * block is lane t % 8 of chunk blockIdx.x * 32 + t / 8 (grid-stride over
 * groups of 32 chunks). */
static __global__ void k_gsq_parts(struct st_gsq_part *parts, const float *g, size_t n)
{
	__shared__ double lane_sum[ST_GSQ_BLOCK];
	__shared__ uint32_t lane_max[ST_GSQ_BLOCK];
	const size_t n_chunks = gsq_chunks_dev(n);
	const unsigned t = threadIdx.x, lane = t % ST_GSQ_LANES;

	for (size_t c0 = (size_t)blockIdx.x * ST_GSQ_CHUNKS_PER_BLOCK; c0 < n_chunks;
	     c0 += (size_t)gridDim.x * ST_GSQ_CHUNKS_PER_BLOCK) {
		const size_t c = c0 + t / ST_GSQ_LANES;
		double acc = 0.0;
		uint32_t am = 0;

		if (c < n_chunks) {
			const size_t off = c * ST_GSQ_CHUNK;
			const size_t len = n - off < ST_GSQ_CHUNK ? n - off : ST_GSQ_CHUNK;

			for (size_t i = lane; i < len; i += ST_GSQ_LANES) {
				uint32_t u = __float_as_uint(g[off + i]);
				double d = (double)__uint_as_float(u);

				acc = __fma_rn(d, d, acc); /* d*d exact: the host's add */
				if ((u & 0x7fffffffu) > am)
					am = u & 0x7fffffffu;
			}
		}
		lane_sum[t] = acc;
		lane_max[t] = am;
		__syncthreads();
		if (lane == 0 && c < n_chunks) {
			const double *l = &lane_sum[t];
			uint32_t mx = 0;

			for (unsigned j = 0; j < ST_GSQ_LANES; j++)
				mx = lane_max[t + j] > mx ? lane_max[t + j] : mx;
			parts[c].sum = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
			parts[c].absmax_bits = mx;
			parts[c].pad = 0;
		}
		__syncthreads();
	}
}

/* Pass 2, one block: the chunks' sums in index order by thread 0 (the
 * block stages ST_GSQ_BLOCK of them at a time in shared memory). out is
 * the op's 16 bytes: the sum, then 1 when some |g| is NaN or Inf, then 0. */
static __global__ void k_gsq_final(struct st_gsq_part *out, const struct st_gsq_part *parts,
				   size_t n)
{
	__shared__ double s_sum[ST_GSQ_BLOCK];
	__shared__ uint32_t s_max[ST_GSQ_BLOCK];
	const size_t n_chunks = gsq_chunks_dev(n);
	double total = 0.0;
	uint32_t amax = 0;

	for (size_t c0 = 0; c0 < n_chunks; c0 += ST_GSQ_BLOCK) {
		const size_t c = c0 + threadIdx.x;

		s_sum[threadIdx.x] = c < n_chunks ? parts[c].sum : 0.0;
		s_max[threadIdx.x] = c < n_chunks ? parts[c].absmax_bits : 0u;
		__syncthreads();
		if (threadIdx.x == 0) {
			const size_t nb = n_chunks - c0 < ST_GSQ_BLOCK ? n_chunks - c0 : ST_GSQ_BLOCK;

			for (size_t j = 0; j < nb; j++) {
				total += s_sum[j];
				amax = s_max[j] > amax ? s_max[j] : amax;
			}
		}
		__syncthreads();
	}
	if (threadIdx.x == 0) {
		out->sum = total;
		out->absmax_bits = amax >= 0x7f800000u ? 1u : 0u;
		out->pad = 0;
	}
}

#endif
