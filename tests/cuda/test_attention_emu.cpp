// The cuda attention kernels (src/backend/kernels/cuda/attention_kernels.cuh, the
// very code nvcc compiles) run on the cpu and held to st_cpu_attention_fwd/bwd.
// Needs no GPU and no nvcc, so the kernels' indexing, masking, tiling and
// barrier placement are checked on every machine.
//
// Emulation (tests/cuda/cuda_emu.h, shared with test_ops_emu): a block is
// ATT_THREADS std::threads; __syncthreads is a std::barrier over the block,
// a warp shuffle is a store to a per-warp buffer between two barriers of
// that warp. Blocks run one after another, so
// the single `smem` array below is the block's shared memory; it is poisoned
// with NaN before each block (a read of an element the block did not write
// shows up as a non-finite output) and the part past the launch's
// shared-memory size must still be poison after it (a write out of bounds).
// Grid, block and shared-memory sizes come from the .cuh, as the host code in
// attention.cu takes them.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <vector>

extern "C" {
#include "strata/kernels.h"
}

/* ---- the CUDA builtins attention_kernels.cuh uses (cuda_emu.h) ---------- */
#include "cuda_emu.h"

#define __shared__

// Big enough for any launch (the backward at hs = 128 takes 66 KiB); the
// kernels' `extern __shared__ float smem[]` names this array.
#define EMU_SMEM_FLOATS (1 << 15)
float smem[EMU_SMEM_FLOATS];

#include "attention_kernels.cuh"

/* ---- launching --------------------------------------------------------- */

static int emu_smem_overrun; /* launches that wrote past their shared memory */
static size_t emu_smem_floats; /* the running launch's shared memory */

static bool is_poison(float x)
{
	uint32_t u;
	const float p = NAN;
	uint32_t pu;

	memcpy(&u, &x, sizeof(u));
	memcpy(&pu, &p, sizeof(pu));
	return u == pu;
}

static void emu_check_guard(size_t smem_floats)
{
	for (size_t i = smem_floats; i < EMU_SMEM_FLOATS; i++) {
		if (!is_poison(smem[i])) {
			emu_smem_overrun++;
			return;
		}
	}
}

// Before each block: the previous block stayed inside its shared memory;
// poison all of it.
static void att_block_hook(unsigned block)
{
	if (block != 0)
		emu_check_guard(emu_smem_floats);
	for (size_t i = 0; i < EMU_SMEM_FLOATS; i++)
		smem[i] = NAN;
}

static void att_launch_hook(unsigned n_blocks)
{
	if (n_blocks > 0)
		emu_check_guard(emu_smem_floats);
}

// Run kern(args...) over grid with ATT_THREADS threads a block and
// smem_bytes of shared memory, as attention.cu launches it.
template <typename K, typename... Args>
static void att_launch(K kern, dim3 grid, size_t smem_bytes, Args... args)
{
	const size_t smem_floats = (smem_bytes + sizeof(float) - 1) / sizeof(float);

	if (smem_floats > EMU_SMEM_FLOATS) {
		fprintf(stderr, "FAIL launch: %zu bytes of shared memory beyond the emulation\n",
			smem_bytes);
		emu_smem_overrun++;
		return;
	}
	emu_smem_floats = smem_floats;
	emu_block_hook = att_block_hook;
	emu_launch_hook = att_launch_hook;
	const int errors0 = emu_launch_errors;
	emu_launch(kern, grid, dim3(ATT_THREADS), args...);
	if (emu_launch_errors != errors0)
		emu_smem_overrun++;
	emu_block_hook = nullptr;
	emu_launch_hook = nullptr;
}

/* ---- checking ---------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float rng_uniform(float lo, float hi)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return lo + (hi - lo) * (float)((rng_state >> 40) * (1.0 / 16777216.0));
}

static int expect_close(const char *shape, const char *what, const std::vector<float> &got,
			const std::vector<float> &ref, double tol)
{
	char label[96];

	snprintf(label, sizeof(label), "%s %s", shape, what);
	return emu_expect_close(label, got, ref, tol);
}

/* Packed documents of 1 to 40 positions (cuda_emu.h) */
static std::vector<int32_t> make_seg(int B, int T, bool packed)
{
	return emu_make_seg(B, T, packed, 40.0f, rng_uniform);
}

static int check_shape(int B, int T, int C, int NH, bool packed = false)
{
	const int hs = C / NH;
	const float scale = 1.0f / sqrtf((float)hs); /* as attention.cu */
	const size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C;
	const size_t n_lse = (size_t)B * NH * T;
	std::vector<float> qkv(n_qkv), dout(n_out), dqkv0(n_qkv);
	std::vector<float> out(n_out), lse(n_lse), dqkv;
	std::vector<float> emu_out(n_out, NAN), emu_lse(n_lse, NAN), emu_dqkv;
	char shape[64];
	int fails = 0;

	snprintf(shape, sizeof(shape), "(%d,%d,%d,%d)%s", B, T, C, NH, packed ? " seg" : "");
	const std::vector<int32_t> segv = make_seg(B, T, packed);
	const int32_t *seg = packed ? segv.data() : nullptr;
	for (auto &x : qkv)
		x = rng_uniform(-2.0f, 2.0f);
	for (auto &x : dout)
		x = rng_uniform(-1.0f, 1.0f);
	for (auto &x : dqkv0) /* the backward accumulates into what is there */
		x = rng_uniform(-1.0f, 1.0f);

	st_cpu_attention_fwd_seg(out.data(), lse.data(), qkv.data(), B, T, C, NH, seg);
	const int overrun0 = emu_smem_overrun;
	att_launch(att_fwd_kernel, att_grid(B, NH, T), att_fwd_smem_bytes(hs),
		   emu_out.data(), emu_lse.data(), (const float *)qkv.data(), T, C, NH, hs,
		   scale, (const int *)seg);
	fails += expect_close(shape, "out", emu_out, out, 1e-5);
	fails += expect_close(shape, "lse", emu_lse, lse, 1e-5);

	// Both sides run the backward from the cpu forward's out and lse, so the
	// backward is checked on its own.
	dqkv = dqkv0;
	emu_dqkv = dqkv0;
	st_cpu_attention_bwd_seg(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B,
				 T, C, NH, seg);
	const dim3 grid = att_grid(B, NH, T);
	const size_t bwd_bytes = att_bwd_smem_bytes(hs);
	att_launch(att_bwd_dkv_kernel, grid, bwd_bytes, emu_dqkv.data(),
		   (const float *)dout.data(), (const float *)qkv.data(),
		   (const float *)out.data(), (const float *)lse.data(), T, C, NH, hs, scale,
		   (const int *)seg);
	att_launch(att_bwd_dq_kernel, grid, bwd_bytes, emu_dqkv.data(),
		   (const float *)dout.data(), (const float *)qkv.data(),
		   (const float *)out.data(), (const float *)lse.data(), T, C, NH, hs, scale,
		   (const int *)seg);
	fails += expect_close(shape, "dqkv", emu_dqkv, dqkv, 1e-5);
	if (emu_smem_overrun != overrun0) {
		fprintf(stderr, "FAIL %s smem: a kernel wrote past its shared memory\n", shape);
		fails++;
	}
	return fails;
}

/* Grouped-query attention: q (B,T,NH*hs), k and v (B,T,NKV*hs). */
static int check_gqa(int B, int T, int NH, int NKV, int hs, bool packed = false)
{
	const float scale = 1.0f / sqrtf((float)hs); /* as attention.cu */
	const size_t nq = (size_t)B * T * NH * hs, nk = (size_t)B * T * NKV * hs;
	const size_t n_lse = (size_t)B * NH * T;
	std::vector<float> q(nq), k(nk), v(nk), dout(nq), out(nq), lse(n_lse);
	std::vector<float> emu_out(nq, NAN), emu_lse(n_lse, NAN);
	char shape[64];
	int fails = 0;

	snprintf(shape, sizeof(shape), "gqa (%d,%d,%d/%d,%d)%s", B, T, NH, NKV, hs,
		 packed ? " seg" : "");
	const std::vector<int32_t> segv = make_seg(B, T, packed);
	const int32_t *seg = packed ? segv.data() : nullptr;
	for (auto *vec : { &q, &k, &v })
		for (auto &x : *vec)
			x = rng_uniform(-2.0f, 2.0f);
	for (auto &x : dout)
		x = rng_uniform(-1.0f, 1.0f);
	st_cpu_gqa_attention_fwd_seg(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T,
				     NH, NKV, hs, seg);
	const int overrun0 = emu_smem_overrun;
	att_launch(gqa_fwd_kernel, att_grid(B, NH, T), att_fwd_smem_bytes(hs), emu_out.data(),
		   emu_lse.data(), (const float *)q.data(), (const float *)k.data(),
		   (const float *)v.data(), T, NH, NKV, hs, scale, (const int *)seg);
	fails += expect_close(shape, "out", emu_out, out, 1e-5);
	fails += expect_close(shape, "lse", emu_lse, lse, 1e-5);

	std::vector<float> dq(nq), dk(nk), dv(nk);
	for (auto *vec : { &dq, &dk, &dv })
		for (auto &x : *vec)
			x = rng_uniform(-1.0f, 1.0f);
	auto edq = dq, edk = dk, edv = dv;
	st_cpu_gqa_attention_bwd_seg(dq.data(), dk.data(), dv.data(), dout.data(), q.data(),
				     k.data(), v.data(), out.data(), lse.data(), B, T, NH, NKV, hs,
				     seg);
	const size_t bwd_bytes = att_bwd_smem_bytes(hs);
	att_launch(gqa_bwd_dkv_kernel, gqa_kv_grid(B, NKV, T), bwd_bytes, edk.data(), edv.data(),
		   (const float *)dout.data(), (const float *)q.data(), (const float *)k.data(),
		   (const float *)v.data(), (const float *)out.data(), (const float *)lse.data(),
		   T, NH, NKV, hs, scale, (const int *)seg);
	att_launch(gqa_bwd_dq_kernel, att_grid(B, NH, T), bwd_bytes, edq.data(),
		   (const float *)dout.data(), (const float *)q.data(), (const float *)k.data(),
		   (const float *)v.data(), (const float *)out.data(), (const float *)lse.data(),
		   T, NH, NKV, hs, scale, (const int *)seg);
	fails += expect_close(shape, "dq", edq, dq, 1e-5);
	fails += expect_close(shape, "dk", edk, dk, 1e-5);
	fails += expect_close(shape, "dv", edv, dv, 1e-5);
	if (emu_smem_overrun != overrun0) {
		fprintf(stderr, "FAIL %s smem: a kernel wrote past its shared memory\n", shape);
		fails++;
	}
	return fails;
}

int main(void)
{
	// (B,T,C,NH): partial last tiles, hs = 24, 128, 20, 64, 4, several
	// tiles, B > 1, a single token.
	static const int shapes[][4] = {
		{1, 37, 96, 4}, {1, 70, 256, 2}, {1, 100, 60, 3}, {2, 65, 64, 1}, {1, 1, 8, 2},
	};
	int fails = 0;

	for (const auto &s : shapes)
		fails += check_shape(s[0], s[1], s[2], s[3]);
	// GQA: 4 query heads over 2 kv heads, partial tiles, B > 1; MQA (one
	// kv head) at hs = 64 over two tiles.
	fails += check_gqa(2, 37, 4, 2, 16);
	fails += check_gqa(1, 40, 3, 1, 64);
	// packed documents (seg): rows of several, tiles that start mid-document
	// and key tiles no query of a tile sees (skipped)
	fails += check_shape(2, 100, 64, 2, true);
	fails += check_gqa(2, 70, 4, 2, 16, true);
	return fails ? 1 : 0;
}
