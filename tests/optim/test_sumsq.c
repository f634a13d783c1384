/* The gradient's sum of squares: correct against a long-double reference,
 * equal bit for bit to the documented summation order on every path and
 * thread count, and NaN/Inf reported. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "optim_test_util.h"

#include <errno.h>
#include <omp.h>

/* The order optim.h promises, written out independently. */
static double contract_sumsq(const void *g, enum st_optim_dtype dt, size_t n)
{
	double total = 0.0;

	for (size_t c0 = 0; c0 < n; c0 += 16384) {
		double l[8] = { 0 };

		for (size_t i = c0; i < n && i < c0 + 16384; i++) {
			double d = tu_g_at(g, dt, i);

			l[(i - c0) % 8] += d * d;
		}
		total += ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
	}
	return total;
}

static void fill(void *g, enum st_optim_dtype dt, size_t n, uint64_t seed)
{
	uint64_t s = seed;

	for (size_t i = 0; i < n; i++) {
		/* magnitudes over many decades, so the order matters */
		float x = ldexpf(tu_rand_f(&s, -1.0f, 1.0f), (int)(tu_rand_u64(&s) % 40) - 20);

		if (dt == ST_OPTIM_BF16)
			((uint16_t *)g)[i] = st_bf16_from_f32(x);
		else
			((float *)g)[i] = x;
	}
}

static void test_sumsq_paths_threads(void **state)
{
	static const size_t lens[] = { 0, 1, 7, 8, 9, 15, 16, 17, 31, 100, 16383, 16384, 16385,
				       5 * 16384 + 3, 257 * 16384 + 5 };
	static const enum st_optim_path paths[] = { ST_OPTIM_PATH_SCALAR, ST_OPTIM_PATH_AVX2,
						    ST_OPTIM_PATH_AVX512 };
	const size_t max_n = 257 * 16384 + 5 + 3;
	unsigned char *buf = malloc(max_n * 4);

	(void)state;
	assert_non_null(buf);
	for (int gi = 0; gi < 2; gi++) {
		enum st_optim_dtype dt = gi ? ST_OPTIM_BF16 : ST_OPTIM_F32;

		for (size_t li = 0; li < ST_ARRAY_LEN(lens); li++) {
			size_t n = lens[li], off = li % 3;
			void *g = buf + off * tu_dtype_bytes(dt);
			double want, got;
			long double ref = 0.0L;

			fill(g, dt, n, 100 + li);
			want = contract_sumsq(g, dt, n);
			for (size_t i = 0; i < n; i++) {
				long double d = tu_g_at(g, dt, i);

				ref += d * d;
			}
			assert_true(fabsl((long double)want - ref) <= 1e-13L * ref);
			for (size_t pi = 0; pi < ST_ARRAY_LEN(paths); pi++) {
				if (!st_optim_path_supported(paths[pi])) {
					if (li == 0)
						printf("optim: path %s skipped: this CPU lacks it\n",
						       st_optim_path_name(paths[pi]));
					continue;
				}
				assert_int_equal(st_optim_path_set(paths[pi]), 0);
				for (int t = 1; t <= 3; t++) {
					omp_set_num_threads(t);
					got = -1.0;
					assert_int_equal(st_grad_sumsq(g, dt, n, &got), 0);
					if (st_f32_bits((float)got) != st_f32_bits((float)want) ||
					    memcmp(&got, &want, sizeof(got))) {
						print_error("%s n %zu threads %d: %.17g want %.17g\n",
							    st_optim_path_name(paths[pi]), n, t, got, want);
						fail();
					}
				}
			}
		}
	}
	/* Every kernel directly too (the avx512 variant without bf16 included). */
	size_t nk;
	const struct st_optim_kernel *const *ks = st_optim_kernels(&nk);
	fill(buf, ST_OPTIM_F32, 16384, 5);
	for (size_t n = 0; n <= 200; n++) {
		double l0[8] = { 0 };
		uint32_t a0 = 0;

		ks[0]->gstat(buf, ST_OPTIM_F32, n, l0, &a0);
		for (size_t k = 1; k < nk; k++) {
			double l[8] = { 0 };
			uint32_t a = 0;

			if (!ks[k]->supported())
				continue;
			ks[k]->gstat(buf, ST_OPTIM_F32, n, l, &a);
			assert_memory_equal(l, l0, sizeof(l));
			assert_int_equal(a, a0);
		}
	}
	assert_int_equal(st_optim_path_set(ST_OPTIM_PATH_AUTO), 0);
	omp_set_num_threads(2);
	free(buf);
}

static void test_sumsq_nonfinite(void **state)
{
	const size_t n = 40000;
	float *g = malloc(n * 4);
	uint16_t *h = malloc(n * 2);
	static const enum st_optim_path paths[] = { ST_OPTIM_PATH_SCALAR, ST_OPTIM_PATH_AVX2,
						    ST_OPTIM_PATH_AVX512 };
	double s;

	(void)state;
	assert_non_null(g && h);
	fill(g, ST_OPTIM_F32, n, 9);
	fill(h, ST_OPTIM_BF16, n, 9);
	for (size_t pi = 0; pi < ST_ARRAY_LEN(paths); pi++) {
		if (!st_optim_path_supported(paths[pi]))
			continue;
		assert_int_equal(st_optim_path_set(paths[pi]), 0);
		g[33333] = NAN;
		assert_int_equal(st_grad_sumsq(g, ST_OPTIM_F32, n, &s), -ERANGE);
		assert_true(isnan(s));
		g[33333] = -INFINITY;
		assert_int_equal(st_grad_sumsq(g, ST_OPTIM_F32, n, &s), -ERANGE);
		assert_true(isinf(s) && s > 0);
		g[33333] = 1.0f;
		assert_int_equal(st_grad_sumsq(g, ST_OPTIM_F32, n, &s), 0);
		/* the largest float squares without overflow in fp64 */
		g[5] = 3.4e38f;
		assert_int_equal(st_grad_sumsq(g, ST_OPTIM_F32, n, &s), 0);
		assert_true(isfinite(s) && s > 1e77);
		g[5] = 0.0f;
		h[n - 1] = 0x7fc0;
		assert_int_equal(st_grad_sumsq(h, ST_OPTIM_BF16, n, &s), -ERANGE);
		h[n - 1] = 0xff80;
		assert_int_equal(st_grad_sumsq(h, ST_OPTIM_BF16, n, &s), -ERANGE);
		h[n - 1] = 0;
		assert_int_equal(st_grad_sumsq(h, ST_OPTIM_BF16, n, &s), 0);
	}
	assert_int_equal(st_grad_sumsq(g, ST_OPTIM_F16, n, &s), -EINVAL);
	assert_int_equal(st_grad_sumsq(NULL, ST_OPTIM_F32, 0, &s), 0);
	assert_true(s == 0.0);
	assert_int_equal(st_optim_path_set(ST_OPTIM_PATH_AUTO), 0);
	free(g);
	free(h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sumsq_paths_threads),
		cmocka_unit_test(test_sumsq_nonfinite),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
