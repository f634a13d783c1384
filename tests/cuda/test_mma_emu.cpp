// The bf16 tensor-core MMA layer (src/backend/kernels/cuda/mma_bf16.cuh) under the
// cpu emulation (tests/cuda/cuda_emu.h), against a plain matrix product, so
// that a fragment-layout mistake fails here before it fails in attention.
//
// 1. Fragments built in this file straight from the PTX ISA's formulas
//    (written out again here, not taken from the .cuh) through
//    mma_bf16_16816 alone: d = c + A B for random A, B, C.
// 2. The shared-memory loads (mma_load_a, mma_load_b) at a padded row
//    stride, a 16x64 by 64x8 product accumulated over four k steps.
// 3. The chain attention uses: S = A B1 (two n8 tiles), packed into an A
//    fragment by mma_a_from_c, times B2; against round_bf16(A B1) B2.
// The reference sums in double; the MMA's fp32 sums are within 1e-6.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" {
#include "strata/kernels.h"
}

#include "cuda_emu.h"

#define __shared__
#define EMU_SMEM_FLOATS (1 << 14)
float smem[EMU_SMEM_FLOATS];

#include "mma_bf16.cuh"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static float rng_uniform(float lo, float hi)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return lo + (hi - lo) * (float)((rng_state >> 40) * (1.0 / 16777216.0));
}

static uint16_t bf(float x)
{
	return st_cpu_bf16_from_f32(x);
}

static float fb(uint16_t h)
{
	return st_cpu_f32_from_bf16(h);
}

/* ---- 1: fragments from the ISA's formulas -------------------------------- */

// a[16*16], b[16*8] (row-major k x n), c and d [16*8] row-major.
static void k_formula(const uint16_t *A, const uint16_t *B, const float *C, float *D)
{
	const int lane = (int)(threadIdx.x & 31), groupID = lane >> 2, tig = lane % 4;
	uint16_t ae[8], be[4];
	uint32_t a[4], b[2];
	float d[4];

	for (int i = 0; i < 8; i++) {
		const int row = (i < 2 || (4 <= i && i < 6)) ? groupID : groupID + 8;
		const int col = i < 4 ? tig * 2 + (i & 1) : tig * 2 + (i & 1) + 8;
		ae[i] = A[row * 16 + col];
	}
	for (int i = 0; i < 4; i++) {
		const int row = i < 2 ? tig * 2 + (i & 1) : tig * 2 + (i & 1) + 8;
		be[i] = B[row * 8 + groupID];
	}
	for (int r = 0; r < 4; r++)
		a[r] = (uint32_t)ae[2 * r] | (uint32_t)ae[2 * r + 1] << 16;
	for (int r = 0; r < 2; r++)
		b[r] = (uint32_t)be[2 * r] | (uint32_t)be[2 * r + 1] << 16;
	for (int i = 0; i < 4; i++) {
		const int row = i < 2 ? groupID : groupID + 8, col = tig * 2 + (i & 1);
		d[i] = C[row * 8 + col];
	}
	mma_bf16_16816(d, a, b);
	for (int i = 0; i < 4; i++) {
		const int row = i < 2 ? groupID : groupID + 8, col = tig * 2 + (i & 1);
		D[row * 8 + col] = d[i];
	}
}

/* ---- 2 and 3: through shared memory --------------------------------------- */

#define LDA 72 /* 64 + 8: padded, as the attention tiles are */
#define LDB 24 /* 16 + 8 */

// A (16 x 64 row-major), Bt (8 x 64: B^T row-major, B is 64 x 8), C, D 16x8.
static void k_smem(const uint16_t *A, const uint16_t *Bt, const float *C, float *D)
{
	extern __shared__ float smem[];
	st_bf16 *As = (st_bf16 *)smem, *Bs = As + 16 * LDA;
	const int lane = (int)(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
	float d[4];

	for (int e = (int)threadIdx.x; e < 16 * 64; e += 32)
		As[e / 64 * LDA + e % 64] = A[e];
	for (int e = (int)threadIdx.x; e < 8 * 64; e += 32)
		Bs[e / 64 * LDA + e % 64] = Bt[e];
	__syncthreads();
	for (int i = 0; i < 4; i++)
		d[i] = C[(i < 2 ? g : g + 8) * 8 + 2 * t + (i & 1)];
	for (int kk = 0; kk < 4; kk++) {
		uint32_t a[4], b[2];
		mma_load_a(a, As + kk * 16, LDA);
		mma_load_b(b, Bs + kk * 16, LDA);
		mma_bf16_16816(d, a, b);
	}
	for (int i = 0; i < 4; i++)
		D[(i < 2 ? g : g + 8) * 8 + 2 * t + (i & 1)] = d[i];
}

// S = A (16x16) B1 (16x16, given as B1^T 16x16 row-major), two n8 tiles;
// then P = bf16(S) as an A fragment times B2 (16x8, given as B2^T 8x16).
static void k_chain(const uint16_t *A, const uint16_t *B1t, const uint16_t *B2t, float *D)
{
	extern __shared__ float smem[];
	st_bf16 *As = (st_bf16 *)smem, *B1s = As + 16 * LDB, *B2s = B1s + 16 * LDB;
	const int lane = (int)(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
	float s0[4] = { 0, 0, 0, 0 }, s1[4] = { 0, 0, 0, 0 }, d[4] = { 0, 0, 0, 0 };
	uint32_t a[4], b[2], p[4];

	for (int e = (int)threadIdx.x; e < 256; e += 32) {
		As[e / 16 * LDB + e % 16] = A[e];
		B1s[e / 16 * LDB + e % 16] = B1t[e];
	}
	for (int e = (int)threadIdx.x; e < 128; e += 32)
		B2s[e / 16 * LDB + e % 16] = B2t[e];
	__syncthreads();
	mma_load_a(a, As, LDB);
	mma_load_b(b, B1s, LDB); /* columns 0..7 of B1 */
	mma_bf16_16816(s0, a, b);
	mma_load_b(b, B1s + 8 * LDB, LDB); /* columns 8..15 */
	mma_bf16_16816(s1, a, b);
	mma_a_from_c(p, s0, s1);
	mma_load_b(b, B2s, LDB);
	mma_bf16_16816(d, p, b);
	for (int i = 0; i < 4; i++)
		D[(i < 2 ? g : g + 8) * 8 + 2 * t + (i & 1)] = d[i];
}

/* ---- checking ------------------------------------------------------------- */

static std::vector<uint16_t> rand_bf16(size_t n)
{
	std::vector<uint16_t> v(n);
	for (auto &x : v)
		x = bf(rng_uniform(-2.0f, 2.0f));
	return v;
}

static int check_formula(int round)
{
	auto A = rand_bf16(256), B = rand_bf16(128);
	std::vector<float> C(128), D(128, NAN), ref(128);
	char label[64];

	for (auto &x : C)
		x = round ? rng_uniform(-4.0f, 4.0f) : 0.0f;
	for (int r = 0; r < 16; r++)
		for (int c = 0; c < 8; c++) {
			double s = C[r * 8 + c];
			for (int k = 0; k < 16; k++)
				s += (double)fb(A[r * 16 + k]) * fb(B[k * 8 + c]);
			ref[r * 8 + c] = (float)s;
		}
	emu_launch(k_formula, dim3(1), dim3(32), (const uint16_t *)A.data(),
		   (const uint16_t *)B.data(), (const float *)C.data(), D.data());
	snprintf(label, sizeof(label), "mma formula %s", round ? "d = c + A B" : "d = A B");
	return emu_expect_close(label, D, ref, 1e-6);
}

static int check_smem(void)
{
	auto A = rand_bf16(16 * 64), Bt = rand_bf16(8 * 64);
	std::vector<float> C(128), D(128, NAN), ref(128);

	for (auto &x : C)
		x = rng_uniform(-4.0f, 4.0f);
	for (int r = 0; r < 16; r++)
		for (int c = 0; c < 8; c++) {
			double s = C[r * 8 + c];
			for (int k = 0; k < 64; k++)
				s += (double)fb(A[r * 64 + k]) * fb(Bt[c * 64 + k]);
			ref[r * 8 + c] = (float)s;
		}
	emu_launch(k_smem, dim3(1), dim3(32), (const uint16_t *)A.data(),
		   (const uint16_t *)Bt.data(), (const float *)C.data(), D.data());
	return emu_expect_close("mma smem 16x64x8", D, ref, 1e-6);
}

static int check_chain(void)
{
	auto A = rand_bf16(256), B1t = rand_bf16(256), B2t = rand_bf16(128);
	std::vector<float> D(128, NAN), ref(128);
	float S[16][16];

	for (int r = 0; r < 16; r++)
		for (int n = 0; n < 16; n++) {
			float s = 0.0f; /* fp32 as the MMA, then rounded as the pack */
			for (int k = 0; k < 16; k++)
				s += fb(A[r * 16 + k]) * fb(B1t[n * 16 + k]);
			S[r][n] = fb(bf(s));
		}
	for (int r = 0; r < 16; r++)
		for (int c = 0; c < 8; c++) {
			double s = 0.0;
			for (int k = 0; k < 16; k++)
				s += (double)S[r][k] * fb(B2t[c * 16 + k]);
			ref[r * 8 + c] = (float)s;
		}
	emu_launch(k_chain, dim3(1), dim3(32), (const uint16_t *)A.data(),
		   (const uint16_t *)B1t.data(), (const uint16_t *)B2t.data(), D.data());
	return emu_expect_close("mma chain C -> A fragment", D, ref, 1e-5);
}

int main(void)
{
	int fails = 0;

	for (int i = 0; i < 3; i++)
		fails += check_formula(i);
	fails += check_smem();
	fails += check_chain();
	fails += emu_launch_errors;
	return fails ? 1 : 0;
}
