// CUDA device code run on the cpu, for tests/cuda/test_*_emu.cpp: just
// enough of the CUDA builtins for the kernels in src/backend/kernels/cuda/*.cuh to
// compile with a host C++20 compiler, and emu_launch() to run one.
//
// A block is blockDim.x*y*z std::threads (a multiple of 32, at most
// EMU_MAX_THREADS); blocks run one after another, x fastest. __syncthreads
// is a std::barrier over the block. A warp is 32 threads of consecutive
// linear thread id; a warp exchange (shuffle, ballot) is a store to a
// per-warp buffer and a barrier of that warp (emu_warp_exchange_words: n
// words a lane at once, for the tensor-core MMA of
// src/backend/kernels/cuda/mma_bf16.cuh, which takes its emulated path under
// ST_CUDA_EMU). __syncthreads_or likewise over the block.
//
// __shared__ is left to the test: a kernel's `extern __shared__` array
// wants it empty (the test then defines that array), static __shared__
// arrays want EMU_STATIC_SHARED, which puts them in the section emu_shared;
// emu_launch fills that section with 0xff bytes (NaN as float, -1 as int)
// before each block, so a read of shared memory the block did not write
// shows up. The test may add its own hooks before each block and after the
// launch (emu_block_hook, emu_launch_hook), run by one thread.
#ifndef ST_TESTS_CUDA_EMU_H
#define ST_TESTS_CUDA_EMU_H

/* Device code that has an emulated variant (src/backend/kernels/cuda/mma_bf16.cuh:
 * the tensor-core MMA) takes it under this. */
#define ST_CUDA_EMU 1

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <math.h>
#include <thread>
#include <vector>

struct dim3 {
	unsigned x, y, z;
	constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_)
	{
	}
};
static thread_local dim3 threadIdx, blockIdx;
static thread_local unsigned emu_tid; /* linear thread id in the block */
static dim3 blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define EMU_STATIC_SHARED static __attribute__((section("emu_shared")))

#define EMU_MAX_THREADS 1024

static inline int min(int a, int b)
{
	return a < b ? a : b;
}

static inline int max(int a, int b)
{
	return a > b ? a : b;
}

static inline unsigned __float_as_uint(float f)
{
	unsigned u;
	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline float __uint_as_float(unsigned u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

static inline int __popc(unsigned m)
{
	return __builtin_popcount(m);
}

// The IEEE round-to-nearest intrinsics (one rounding each; fmaf and sqrtf
// are correctly rounded in glibc, and the emulation tests are compiled with
// -ffp-contract=off so a product is never fused behind their back).
static inline float __fmul_rn(float a, float b)
{
	return a * b;
}

static inline float __fadd_rn(float a, float b)
{
	return a + b;
}

static inline float __fmaf_rn(float a, float b, float c)
{
	return fmaf(a, b, c);
}

static inline float __fsqrt_rn(float a)
{
	return sqrtf(a);
}

static inline float __fdiv_rn(float a, float b)
{
	return a / b;
}

static inline double __fma_rn(double a, double b, double c)
{
	return fma(a, b, c);
}

// atomicAdd on an unsigned: the threads of a block run at once.
static inline unsigned atomicAdd(unsigned *p, unsigned v)
{
	return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}

static std::barrier<> *emu_block_bar;
static unsigned emu_block_threads;
static std::vector<std::barrier<> *> emu_warp_bar;
static uint32_t emu_warp_buf[2][EMU_MAX_THREADS / 32][32];
static thread_local unsigned emu_warp_parity;
static int emu_or_buf[2][EMU_MAX_THREADS];
static thread_local unsigned emu_or_parity;

static inline void __syncthreads()
{
	emu_block_bar->arrive_and_wait();
}

// One barrier an exchange: consecutive exchanges of a thread alternate
// between two buffers, and no lane can store into a buffer for exchange
// k+1 (the one of exchange k-1) before every lane has passed exchange k's
// barrier, which it reaches only after reading its values of exchange k-1.
// Returns the warp's row of the buffer, every lane's value in it.
static inline const uint32_t *emu_warp_exchange(uint32_t v)
{
	const unsigned w = emu_tid >> 5, lane = emu_tid & 31;
	uint32_t *buf = emu_warp_buf[emu_warp_parity][w];

	emu_warp_parity ^= 1;
	buf[lane] = v;
	emu_warp_bar[w]->arrive_and_wait();
	return buf;
}

// The same for n (at most EMU_WARP_WORDS) words a lane: returns the warp's
// 32 x n words, lane l's at [l * n, l * n + n). Its own pair of buffers.
#define EMU_WARP_WORDS 8
static uint32_t emu_warp_wbuf[2][EMU_MAX_THREADS / 32][32 * EMU_WARP_WORDS];
static thread_local unsigned emu_warp_wparity;

static inline const uint32_t *emu_warp_exchange_words(const uint32_t *v, unsigned n)
{
	const unsigned w = emu_tid >> 5, lane = emu_tid & 31;
	uint32_t *buf = emu_warp_wbuf[emu_warp_wparity][w];

	emu_warp_wparity ^= 1;
	memcpy(buf + lane * n, v, n * sizeof(*v));
	emu_warp_bar[w]->arrive_and_wait();
	return buf;
}

static inline float __shfl_sync(unsigned, float v, int src_lane)
{
	return __uint_as_float(emu_warp_exchange(__float_as_uint(v))[(unsigned)src_lane & 31]);
}

static inline float __shfl_xor_sync(unsigned, float v, int lane_mask)
{
	const unsigned src = ((emu_tid & 31) ^ (unsigned)lane_mask) & 31;
	return __uint_as_float(emu_warp_exchange(__float_as_uint(v))[src]);
}

static inline unsigned __ballot_sync(unsigned, int pred)
{
	const uint32_t *all = emu_warp_exchange(pred != 0);
	unsigned m = 0;

	for (unsigned l = 0; l < 32; l++)
		m |= all[l] ? 1u << l : 0u;
	return m;
}

// The same two-buffer scheme over the block's barrier.
static inline int __syncthreads_or(int pred)
{
	int *buf = emu_or_buf[emu_or_parity];
	int any = 0;

	emu_or_parity ^= 1;
	buf[emu_tid] = pred != 0;
	emu_block_bar->arrive_and_wait();
	for (unsigned t = 0; t < emu_block_threads; t++)
		any |= buf[t];
	return any;
}

/* ---- launching --------------------------------------------------------- */

extern "C" char __start_emu_shared[] __attribute__((weak));
extern "C" char __stop_emu_shared[] __attribute__((weak));

/* Run by one thread before each block (block = its index in launch order)
 * and after the launch (n_blocks run); either may be NULL. */
static void (*emu_block_hook)(unsigned block);
static void (*emu_launch_hook)(unsigned n_blocks);
static int emu_launch_errors; /* launches the emulation could not run */

// Run kern(args...) over grid with block threads a block, as
// kern<<<grid, block>>>(args...) does.
template <typename K, typename... Args>
static void emu_launch(K kern, dim3 grid, dim3 block, Args... args)
{
	const unsigned nthreads = block.x * block.y * block.z, nwarps = nthreads / 32;
	const unsigned n_blocks = grid.x * grid.y * grid.z;

	if (nthreads == 0 || nthreads > EMU_MAX_THREADS || nthreads % 32 != 0) {
		fprintf(stderr, "FAIL launch: a block of %u threads is beyond the emulation\n",
			nthreads);
		emu_launch_errors++;
		return;
	}
	blockDim = block;
	gridDim = grid;
	emu_block_threads = nthreads;
	std::barrier<> block_bar(nthreads);
	emu_block_bar = &block_bar;
	emu_warp_bar.clear();
	for (unsigned w = 0; w < nwarps; w++)
		emu_warp_bar.push_back(new std::barrier<>(32));

	auto body = [&](unsigned t) {
		emu_tid = t;
		threadIdx = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
		emu_warp_parity = 0;
		emu_warp_wparity = 0;
		emu_or_parity = 0;
		unsigned k = 0;
		for (unsigned bz = 0; bz < grid.z; bz++) {
			for (unsigned by = 0; by < grid.y; by++) {
				for (unsigned bx = 0; bx < grid.x; bx++, k++) {
					if (t == 0) {
						if (__start_emu_shared && __stop_emu_shared)
							memset(__start_emu_shared, 0xff,
							       (size_t)(__stop_emu_shared -
									__start_emu_shared));
						if (emu_block_hook)
							emu_block_hook(k);
					}
					blockIdx = dim3(bx, by, bz);
					block_bar.arrive_and_wait(); /* poison is in place */
					kern(args...);
					block_bar.arrive_and_wait(); /* the block is done */
				}
			}
		}
	};
	std::vector<std::thread> threads;
	for (unsigned t = 0; t < nthreads; t++)
		threads.emplace_back(body, t);
	for (auto &th : threads)
		th.join();
	if (emu_launch_hook)
		emu_launch_hook(n_blocks);
	for (auto *b : emu_warp_bar)
		delete b;
	emu_warp_bar.clear();
	emu_block_bar = nullptr;
}

// Dynamic shared memory, for kernels that declare `extern __shared__ float
// smem[]`: a test that defines EMU_SMEM_FLOATS before including this file
// gets that array (and __shared__ as nothing) and emu_launch_smem(), which
// runs a launch with `bytes` of it as kern<<<grid, block, bytes>>> would:
// every float of smem poisoned with 0xff bytes (a bf16 and an fp32 NaN)
// before each block, so a read of what the block did not write shows up;
// after each block the part past `bytes` must be untouched (a write there
// is counted in emu_smem_overruns, as is a launch asking for more than
// the array). It takes the block hooks for itself.
#ifdef EMU_SMEM_FLOATS
#define __shared__
float smem[EMU_SMEM_FLOATS];
static int emu_smem_overruns;
static size_t emu_smem_bytes;

static void emu_smem_guard(void)
{
	const unsigned char *b = (const unsigned char *)smem;

	for (size_t i = emu_smem_bytes; i < sizeof(smem); i++)
		if (b[i] != 0xff) {
			emu_smem_overruns++;
			return;
		}
}

static void emu_smem_block_hook(unsigned block)
{
	if (block != 0)
		emu_smem_guard();
	memset(smem, 0xff, sizeof(smem));
}

static void emu_smem_launch_hook(unsigned n_blocks)
{
	if (n_blocks > 0)
		emu_smem_guard();
}

template <typename K, typename... Args>
static void emu_launch_smem(K kern, dim3 grid, dim3 block, size_t bytes, Args... args)
{
	if (bytes > sizeof(smem)) {
		fprintf(stderr, "FAIL launch: %zu bytes of shared memory beyond the emulation's %zu\n",
			bytes, sizeof(smem));
		emu_smem_overruns++;
		return;
	}
	emu_smem_bytes = bytes;
	emu_block_hook = emu_smem_block_hook;
	emu_launch_hook = emu_smem_launch_hook;
	emu_launch(kern, grid, block, args...);
	emu_block_hook = nullptr;
	emu_launch_hook = nullptr;
}
#endif

// Test data: xorshift64*, the same numbers on every machine.
struct emu_rng {
	uint64_t s;
	explicit emu_rng(uint64_t seed) : s(seed * 0x9e3779b97f4a7c15ull + 1) {}
	uint32_t u32()
	{
		s ^= s >> 12;
		s ^= s << 25;
		s ^= s >> 27;
		return (uint32_t)((s * 0x2545f4914f6cdd1dull) >> 32);
	}
	// uniform in [-scale, scale)
	float uniform(float scale)
	{
		return scale * ((float)(u32() >> 8) / 8388608.0f - 1.0f);
	}
	// uniform in [0, n)
	int below(int n)
	{
		return (int)(u32() % (uint32_t)n);
	}
};

// Every element finite and ||got - ref|| / ||ref|| <= tol (absolute when ref
// is all zero), the sizes equal; one "FAIL <label>: ..." line on stderr if
// not, one "ok" line unless ST_QUIET is set. Returns 1 on failure, else 0.
static inline int emu_expect_close(const char *label, const std::vector<float> &got,
				   const std::vector<float> &ref, double tol)
{
	double num = 0.0, den = 0.0, max_abs = 0.0;
	size_t max_at = 0;

	if (got.size() != ref.size()) {
		fprintf(stderr, "FAIL %s: %zu elements, %zu expected\n", label, got.size(),
			ref.size());
		return 1;
	}
	for (size_t i = 0; i < got.size(); i++) {
		if (!std::isfinite(got[i])) {
			fprintf(stderr, "FAIL %s: element %zu of %zu is %g (ref %g)\n", label, i,
				got.size(), (double)got[i], (double)ref[i]);
			return 1;
		}
		const double d = (double)got[i] - (double)ref[i];
		num += d * d;
		den += (double)ref[i] * (double)ref[i];
		if (std::fabs(d) > max_abs) {
			max_abs = std::fabs(d);
			max_at = i;
		}
	}
	const double rel = den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
	if (!(rel <= tol)) {
		fprintf(stderr,
			"FAIL %s: relative error %.3g > %.1g over %zu elements (largest |diff| "
			"%.3g at %zu: emu %.9g cpu %.9g)\n",
			label, rel, tol, got.size(), max_abs, max_at, (double)got[max_at],
			(double)ref[max_at]);
		return 1;
	}
	if (!getenv("ST_QUIET"))
		printf("ok   %-34s n=%-7zu rel %.2e\n", label, got.size(), rel);
	return 0;
}

// a - b element by element: what a kernel added to a buffer that started
// as b, to compare as emu_expect_close compares (increments, not sums).
static inline std::vector<float> emu_minus(const std::vector<float> &a,
					   const std::vector<float> &b)
{
	std::vector<float> d(a.size());
	for (size_t i = 0; i < a.size(); i++)
		d[i] = a[i] - b[i];
	return d;
}

// Packed documents for the attention tests: seg (B,T), each row cut into
// documents of 1 to max_len positions (lengths from uniform(0, max_len)),
// seg[t] the position where t's document starts; empty when !packed (the
// kernels' seg NULL: causal only).
template <typename U>
static std::vector<int32_t> emu_make_seg(int B, int T, bool packed, float max_len, U uniform)
{
	std::vector<int32_t> seg;

	if (!packed)
		return seg;
	seg.resize((size_t)B * T);
	for (int b = 0; b < B; b++)
		for (int t = 0, s = 0, left = 0; t < T; t++, left--) {
			if (left <= 0) {
				s = t;
				left = 1 + (int)uniform(0.0f, max_len);
			}
			seg[(size_t)b * T + t] = s;
		}
	return seg;
}

#endif
