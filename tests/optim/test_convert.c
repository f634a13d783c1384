/* bf16 and fp16 conversions: st_bf16_from_f32 / st_f16_from_f32 against an
 * independent nearest-value search in double, round trips, and every
 * kernel's vector conversion of W against them over all exponents. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "optim_test_util.h"

/* Low 16 bits tried under every high 16-bit pattern: bf16 ties and
 * neighbours, and fp16's rounding bit 13 with its neighbours. */
static uint32_t lows[64];
static size_t n_lows;

static void lows_init(void)
{
	static const uint32_t base[] = { 0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu,
					 0x4000u, 0xc000u, 0x1234u };
	static const uint32_t f16[] = { 0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x1fffu };
	uint64_t s = 3;

	n_lows = 0;
	for (size_t i = 0; i < ST_ARRAY_LEN(base); i++)
		lows[n_lows++] = base[i];
	for (uint32_t b = 0; b < 8; b++)
		for (size_t i = 0; i < ST_ARRAY_LEN(f16); i++)
			lows[n_lows++] = (b << 13) | f16[i];
	while (n_lows < ST_ARRAY_LEN(lows))
		lows[n_lows++] = (uint32_t)tu_rand_u64(&s) & 0xffffu;
}

/* Pick between the lower candidate lo_bits (value lo) and lo_bits + 1
 * (value hi) for |x|: nearest, ties to the even bit pattern. */
static uint32_t pick(double ax, double lo, double hi, uint32_t lo_bits)
{
	double dl = ax - lo, dh = hi - ax;

	if (dl < dh)
		return lo_bits;
	if (dh < dl)
		return lo_bits + 1;
	return (lo_bits & 1u) ? lo_bits + 1 : lo_bits;
}

static uint16_t ref_bf16(uint32_t u)
{
	uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu, t = a >> 16;
	double ax, lo, hi;

	if (a > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40u);
	if (a == 0x7f800000u)
		return (uint16_t)(sign | 0x7f80u);
	ax = st_f32_from_bits(a);
	lo = st_f32_from_bits(t << 16);
	hi = t + 1 == 0x7f80u ? ldexp(1.0, 128) : (double)st_f32_from_bits((t + 1) << 16);
	return (uint16_t)(sign | pick(ax, lo, hi, t));
}

static double f16_val[0x7c01];

static void f16_table_init(void)
{
	for (uint32_t h = 0; h < 0x7c00u; h++) {
		uint32_t e = h >> 10, m = h & 0x3ffu;

		f16_val[h] = e ? ldexp(1.0 + m / 1024.0, (int)e - 15) : ldexp(m, -24);
	}
	f16_val[0x7c00] = 65536.0; /* where the next value would be: rounding to it means Inf */
}

static uint16_t ref_f16(uint32_t u)
{
	uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu, lo = 0, hi = 0x7c00u;
	double ax;

	if (a > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
	ax = st_f32_from_bits(a);
	if (ax >= 65536.0)
		return (uint16_t)(sign | 0x7c00u);
	while (hi - lo > 1) { /* largest lo with f16_val[lo] <= ax */
		uint32_t mid = (lo + hi) / 2;

		if (f16_val[mid] <= ax)
			lo = mid;
		else
			hi = mid;
	}
	return (uint16_t)(sign | pick(ax, f16_val[lo], f16_val[lo + 1], lo));
}

static void test_bf16_vs_reference(void **state)
{
	(void)state;
	for (uint32_t hi = 0; hi < 0x10000u; hi++) {
		for (size_t j = 0; j < n_lows; j++) {
			uint32_t u = (hi << 16) | lows[j];
			uint16_t got = st_bf16_from_f32(st_f32_from_bits(u)), want = ref_bf16(u);

			if (got != want) {
				print_error("bf16(%08x) = %04x, want %04x\n", u, got, want);
				fail();
			}
		}
	}
	/* named cases */
	assert_int_equal(st_bf16_from_f32(1.0f), 0x3f80);
	assert_int_equal(st_bf16_from_f32(st_f32_from_bits(0x3f808000u)), 0x3f80); /* tie -> even */
	assert_int_equal(st_bf16_from_f32(st_f32_from_bits(0x3f818000u)), 0x3f82); /* tie -> even */
	assert_int_equal(st_bf16_from_f32(st_f32_from_bits(0x7f7fffffu)), 0x7f80); /* -> Inf */
	assert_int_equal(st_bf16_from_f32(st_f32_from_bits(0x007fffffu)), 0x0080); /* subnormal kept */
	assert_int_equal(st_bf16_from_f32(st_f32_from_bits(0x7f800001u)), 0x7fc0); /* sNaN stays NaN */
	assert_int_equal(st_bf16_from_f32(st_f32_from_bits(0xffffffffu)), 0xffff);
	assert_true(isnan(st_f32_from_bf16(st_bf16_from_f32(NAN))));
}

static void test_f16_vs_reference(void **state)
{
	(void)state;
	for (uint32_t hi = 0; hi < 0x10000u; hi++) {
		for (size_t j = 0; j < n_lows; j++) {
			uint32_t u = (hi << 16) | lows[j];
			uint16_t got = st_f16_from_f32(st_f32_from_bits(u)), want = ref_f16(u);

			if (got != want) {
				print_error("f16(%08x) = %04x, want %04x\n", u, got, want);
				fail();
			}
		}
	}
	assert_int_equal(st_f16_from_f32(65504.0f), 0x7bff);
	assert_int_equal(st_f16_from_f32(65520.0f), 0x7c00); /* tie -> even -> Inf */
	assert_int_equal(st_f16_from_f32(ldexpf(1.0f, -24)), 0x0001);
	assert_int_equal(st_f16_from_f32(ldexpf(1.0f, -25)), 0x0000); /* tie -> even 0 */
	assert_int_equal(st_f16_from_f32(-ldexpf(1.5f, -25)), 0x8001);
}

static void test_round_trips(void **state)
{
	(void)state;
	for (uint32_t h = 0; h < 0x10000u; h++) {
		float b = st_f32_from_bf16((uint16_t)h), f = st_f32_from_f16((uint16_t)h);

		assert_int_equal(st_f32_bits(b), h << 16);
		if ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu))
			assert_int_equal(st_bf16_from_f32(b), h | 0x40u);
		else
			assert_int_equal(st_bf16_from_f32(b), h);
		if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) {
			assert_true(isnan(f));
			assert_int_equal(st_f16_from_f32(f), h | 0x200u);
		} else if ((h & 0x7fffu) == 0x7c00u) {
			assert_true(isinf(f) && (f < 0) == !!(h & 0x8000u));
			assert_int_equal(st_f16_from_f32(f), h);
		} else {
			assert_int_equal(st_f16_from_f32(f), h);
			assert_true((double)f == ((h & 0x8000u) ? -1.0 : 1.0) * f16_val[h & 0x7fffu]);
		}
	}
}

/* Every kernel writes W as exactly these conversions: lr = 0 keeps P, so
 * P sweeps all exponents, subnormals, ties, overflow edges and NaNs. */
static void test_kernel_conversions(void **state)
{
	const size_t n = 0x10000u * 9u + 13u;
	const struct st_adam_hparams hp = { .lr = 0.0f, .beta1 = 0.9f, .beta2 = 0.99f,
					    .eps = 1e-8f, .grad_scale = 1.0f, .step = 1 };
	static const enum st_optim_dtype wdts[] = { ST_OPTIM_BF16, ST_OPTIM_F16, ST_OPTIM_F32 };
	float *p0 = malloc(n * 4), *p = malloc(n * 4), *m = calloc(n, 4), *v = calloc(n, 4);
	float *g = malloc(n * 4);
	uint32_t *w = malloc(n * 4), *wref = malloc(n * 4);
	size_t nk;
	const struct st_optim_kernel *const *ks = st_optim_kernels(&nk);
	uint64_t s = 17;

	(void)state;
	assert_non_null(p0 && p && m && v && g && w && wref);
	for (size_t i = 0; i < n; i++) {
		p0[i] = st_f32_from_bits((uint32_t)((i / 9) << 16) | (i % 9 < 6 ? lows[i % 9] : lows[9 + 6 * (i % 8) + 3]));
		g[i] = tu_rand_f(&s, -1.0f, 1.0f);
	}
	for (size_t wi = 0; wi < ST_ARRAY_LEN(wdts); wi++) {
		for (size_t k = 0; k < nk; k++) {
			struct st_adam_bufs b = { .g = g, .g_dtype = ST_OPTIM_F32, .p = p, .m = m,
						  .v = v, .w = w, .w_dtype = wdts[wi] };

			if (!ks[k]->supported()) {
				printf("optim: kernel %s skipped: this CPU lacks it\n", ks[k]->name);
				continue;
			}
			memcpy(p, p0, n * 4);
			memset(m, 0, n * 4);
			memset(v, 0, n * 4);
			memset(w, 0x5a, n * 4);
			assert_int_equal(tu_kernel_run(ks[k], &hp, &b, n), 0);
			for (size_t i = 0; i < n; i++) {
				if (!isnan(p0[i]) && p0[i] != 0.0f)
					assert_int_equal(st_f32_bits(p[i]), st_f32_bits(p0[i]));
				if (wdts[wi] == ST_OPTIM_BF16)
					assert_int_equal(((uint16_t *)w)[i], st_bf16_from_f32(p[i]));
				else if (wdts[wi] == ST_OPTIM_F16)
					assert_int_equal(((uint16_t *)w)[i], st_f16_from_f32(p[i]));
				else
					assert_int_equal(w[i], st_f32_bits(p[i]));
			}
			if (k == 0)
				memcpy(wref, w, n * 4);
			else
				assert_memory_equal(w, wref, n * tu_dtype_bytes(wdts[wi]));
		}
	}
	free(p0);
	free(p);
	free(m);
	free(v);
	free(g);
	free(w);
	free(wref);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bf16_vs_reference),
		cmocka_unit_test(test_f16_vs_reference),
		cmocka_unit_test(test_round_trips),
		cmocka_unit_test(test_kernel_conversions),
	};

	lows_init();
	f16_table_init();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
