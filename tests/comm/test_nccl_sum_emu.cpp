// The nccl backend's local-sum kernel (src/comm/nccl_sum_kernels.cuh, the
// very code nvcc compiles for nccl_sum.cu) run on the cpu through
// tests/cuda/cuda_emu.h, against the rank-order fold of strata/comm.h bit
// for bit: fp32 and fp64, 1 to 5 terms, counts that leave a partial block
// and counts past the grid cap (the grid-stride loop). The data makes the
// reverse order and a fold from +0 give other bits, so a kernel that
// reordered or started from zero fails. Needs no GPU and no nvcc.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda_emu.h"

#include "nccl_sum_kernels.cuh"

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static double value(int q, size_t i)
{
	uint64_t h = mix((uint64_t)q * 7919u + i);

	if (i == 0)
		return -0.0;
	return std::ldexp((double)(h & 0xffffff) / (double)0x1000000 - 0.5,
			  (int)((h >> 24) % 40) - 20);
}

/* grid 0: the kernel's own (st_comm_sum_grid); else that many blocks, fewer
 * than n needs, so the grid-stride loop takes several turns. */
template <typename T> static int check(size_t n, int terms, unsigned grid = 0)
{
	std::vector<T> in((size_t)terms * n), out(n, (T)NAN), ref(n), rev(n);

	for (int q = 0; q < terms; q++)
		for (size_t i = 0; i < n; i++)
			in[(size_t)q * n + i] = (T)value(q, i);
	for (size_t i = 0; i < n; i++) {
		T a = in[i], b = in[(size_t)(terms - 1) * n + i];

		for (int q = 1; q < terms; q++)
			a = a + in[(size_t)q * n + i];
		for (int q = terms - 2; q >= 0; q--)
			b = b + in[(size_t)q * n + i];
		ref[i] = a;
		rev[i] = b;
	}
	emu_launch(k_comm_fold<T>, dim3(grid ? grid : st_comm_sum_grid(n)), dim3(ST_COMM_SUM_BLOCK),
		   (const T *)in.data(), out.data(), n, terms);
	if (std::memcmp(out.data(), ref.data(), n * sizeof(T)) != 0) {
		fprintf(stderr, "FAIL fold %s n=%zu terms=%d: differs from the rank-order fold\n",
			sizeof(T) == 4 ? "f32" : "f64", n, terms);
		return 1;
	}
	if (!std::signbit(out[0])) {
		fprintf(stderr, "FAIL fold: -0.0 lost its sign\n");
		return 1;
	}
	if (terms >= 3 && n > 1000 && std::memcmp(rev.data(), ref.data(), n * sizeof(T)) == 0) {
		fprintf(stderr, "FAIL: the data does not tell orders apart\n");
		return 1;
	}
	return 0;
}

int main(void)
{
	static const size_t counts[] = { 1, 3, 255, 257, 5000 };
	int fails = 0;

	for (int terms = 1; terms <= 5; terms++)
		for (size_t n : counts) {
			fails += check<float>(n, terms);
			fails += check<double>(n, terms);
		}
	/* Past the grid cap each thread takes several elements: the same
	 * loop, shown with 3 blocks over 5000 elements (the cap's grid would
	 * take minutes to emulate). */
	fails += check<float>(5000, 4, 3);
	fails += check<double>(5000, 3, 3);
	if (st_comm_sum_grid(1) != 1 || st_comm_sum_grid(257) != 2 ||
	    st_comm_sum_grid((size_t)1 << 40) != ST_COMM_SUM_MAX_GRID) {
		fprintf(stderr, "FAIL st_comm_sum_grid\n");
		fails++;
	}
	fails += emu_launch_errors;
	if (!getenv("ST_QUIET") || fails)
		printf("nccl-sum-emu: %d failure(s)\n", fails);
	return fails ? 1 : 0;
}
