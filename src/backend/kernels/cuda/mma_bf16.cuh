/* The warp-level bf16 tensor-core MMA, mma.sync.aligned.m16n8k16.row.col
 * .f32.bf16.bf16.f32 (sm_80+), and the plain shared-memory fragment loads
 * the bf16 attention (attention_bf16_kernels.cuh) builds on.
 *
 * On nvcc it is the PTX instruction. Under the cpu emulation
 * (tests/cuda/cuda_emu.h defines ST_CUDA_EMU) each lane hands its a and b
 * registers to a per-warp buffer (emu_warp_exchange_words: one barrier of
 * the warp), rebuilds the two rows of A and the two columns of B its d
 * elements need from the documented layout, and computes them in fp32
 * (bf16 products are exact in fp32; sum over k = 0..15 in order, then c).
 *
 * Fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k16 with
 * floating point type"), lane = 4 * groupID + threadID_in_group, so
 * g = lane >> 2 and t = lane & 3; each .b32 register holds two bf16, the
 * lower-indexed element in the low 16 bits:
 *   A (16x16, row):  a0,a1 (reg 0) row g,   cols 2t, 2t+1
 *                    a2,a3 (reg 1) row g+8, cols 2t, 2t+1
 *                    a4,a5 (reg 2) row g,   cols 2t+8, 2t+9
 *                    a6,a7 (reg 3) row g+8, cols 2t+8, 2t+9
 *   B (16x8, col):   b0,b1 (reg 0) rows 2t, 2t+1,   col g
 *                    b2,b3 (reg 1) rows 2t+8, 2t+9, col g
 *   C, D (16x8 f32): c0,c1 row g, cols 2t, 2t+1; c2,c3 row g+8, the same
 * The two accumulators of the n8 tiles [0,8) and [8,16) of a 16x16 product
 * are therefore exactly the A fragment of that 16x16 matrix once packed to
 * bf16 (mma_a_from_c): P = softmax(S) goes from one MMA into the next
 * without shared memory.
 *
 * Shared-memory tiles are row-major bf16 (uint16_t) with an even row
 * stride ld (elements) and 4-byte aligned rows: A is read as rows of the
 * 16x16 block; B as "n-major", element (k, n) at s[n * ld + k], i.e. the
 * rows of B^T (the K tile for Q K^T; a transposed copy for P V). */
#ifndef ST_CUDA_MMA_BF16_CUH
#define ST_CUDA_MMA_BF16_CUH

#include <math.h>
#include <stdint.h>

typedef uint16_t st_bf16;

/* bf16 -> fp32, exact. */
__device__ __forceinline__ float mma_bf16_to_f32(st_bf16 h)
{
	return __uint_as_float((uint32_t)h << 16);
}

/* fp32 -> bf16 as st_cpu_bf16_from_f32: RNE, quiet NaN with sign, no flush. */
__device__ __forceinline__ st_bf16 mma_f32_to_bf16(float f)
{
	uint32_t u = __float_as_uint(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (st_bf16)((u >> 16) | 0x0040u);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (st_bf16)(u >> 16);
}

/* Two bf16 of lo and hi in one register, lo in the low half. */
__device__ __forceinline__ uint32_t mma_pack_bf16x2(float lo, float hi)
{
	return (uint32_t)mma_f32_to_bf16(lo) | ((uint32_t)mma_f32_to_bf16(hi) << 16);
}

/* The 32 bits at p (two bf16, p[0] low), p 4-byte aligned. */
__device__ __forceinline__ uint32_t mma_ld_u32(const st_bf16 *p)
{
#ifdef ST_CUDA_EMU
	uint32_t u;
	memcpy(&u, p, sizeof(u));
	return u;
#else
	return *reinterpret_cast<const uint32_t *>(p);
#endif
}

__device__ __forceinline__ void mma_st_u32(st_bf16 *p, uint32_t u)
{
#ifdef ST_CUDA_EMU
	memcpy(p, &u, sizeof(u));
#else
	*reinterpret_cast<uint32_t *>(p) = u;
#endif
}

/* A fragment of the 16x16 block at s (row-major, row stride ld). */
__device__ __forceinline__ void mma_load_a(uint32_t a[4], const st_bf16 *s, int ld)
{
	const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
	const st_bf16 *r0 = s + g * ld + 2 * t, *r1 = r0 + 8 * ld;

	a[0] = mma_ld_u32(r0);
	a[1] = mma_ld_u32(r1);
	a[2] = mma_ld_u32(r0 + 8);
	a[3] = mma_ld_u32(r1 + 8);
}

/* B fragment of the 16x8 (k x n) block whose element (k, n) is s[n*ld + k]. */
__device__ __forceinline__ void mma_load_b(uint32_t b[2], const st_bf16 *s, int ld)
{
	const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
	const st_bf16 *r = s + g * ld + 2 * t;

	b[0] = mma_ld_u32(r);
	b[1] = mma_ld_u32(r + 8);
}

/* The A fragment of the 16x16 matrix whose columns [0,8) are accumulator
 * c0 and [8,16) accumulator c1, rounded to bf16. */
__device__ __forceinline__ void mma_a_from_c(uint32_t a[4], const float c0[4], const float c1[4])
{
	a[0] = mma_pack_bf16x2(c0[0], c0[1]);
	a[1] = mma_pack_bf16x2(c0[2], c0[3]);
	a[2] = mma_pack_bf16x2(c1[0], c1[1]);
	a[3] = mma_pack_bf16x2(c1[2], c1[3]);
}

#ifdef ST_CUDA_EMU
/* Element i (0..7) of A held by a lane, as (row, col) of the 16x16 block,
 * and element i (0..3) of B as (row k, col n): the PTX ISA's formulas. */
static inline void mma_emu_a_pos(unsigned lane, int i, int *row, int *col)
{
	const int g = (int)(lane >> 2), t = (int)(lane & 3);
	*row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
	*col = t * 2 + (i & 1) + (i >= 4 ? 8 : 0);
}

static inline void mma_emu_b_pos(unsigned lane, int i, int *row, int *col)
{
	const int g = (int)(lane >> 2), t = (int)(lane & 3);
	*row = t * 2 + (i & 1) + (i >= 2 ? 8 : 0);
	*col = g;
}

static inline float mma_emu_half(uint32_t reg, int hi)
{
	return __uint_as_float((hi ? reg >> 16 : reg & 0xffffu) << 16);
}
#endif

/* d += A * B over one warp: the m16n8k16 bf16 MMA with fp32 accumulation.
 * Every lane of the warp calls it with its own fragments. */
__device__ __forceinline__ void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2])
{
#ifdef ST_CUDA_EMU
	uint32_t mine[6] = { a[0], a[1], a[2], a[3], b[0], b[1] };
	const uint32_t *all = emu_warp_exchange_words(mine, 6);
	float A[16][16], Bm[16][8];

	for (unsigned l = 0; l < 32; l++) {
		const uint32_t *w = all + 6 * l;
		for (int i = 0; i < 8; i++) {
			int r, c;
			mma_emu_a_pos(l, i, &r, &c);
			A[r][c] = mma_emu_half(w[i >> 1], i & 1);
		}
		for (int i = 0; i < 4; i++) {
			int r, c;
			mma_emu_b_pos(l, i, &r, &c);
			Bm[r][c] = mma_emu_half(w[4 + (i >> 1)], i & 1);
		}
	}
	const unsigned lane = emu_tid & 31;
	const int g = (int)(lane >> 2), t = (int)(lane & 3);
	for (int i = 0; i < 4; i++) {
		const int r = i < 2 ? g : g + 8, c = t * 2 + (i & 1);
		float acc = 0.0f;
		for (int k = 0; k < 16; k++)
			acc += A[r][k] * Bm[k][c];
		d[i] += acc;
	}
#else
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
		     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/* Max and sum over the four lanes of a group (the lanes 4g..4g+3 that hold
 * one row of an accumulator fragment), in one fixed order: the same bits
 * each run. Every lane of the warp must call them. */
__device__ __forceinline__ float mma_group_max(float x)
{
	x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
	return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float mma_group_sum(float x)
{
	x += __shfl_xor_sync(0xffffffffu, x, 1);
	return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

#endif /* ST_CUDA_MMA_BF16_CUH */
