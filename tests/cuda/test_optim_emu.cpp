// The GPU optimizer's kernels (src/backend/kernels/cuda/optim_kernels.cuh, the very
// code nvcc compiles for optim.cu) run on the cpu and held to the host's
// AdamW and sum of squares (src/optim) BIT FOR BIT: P, M, V and W (fp32,
// bf16, none) against st_adam_apply(..., ST_ADAM_GRAD_CHECKED) on every
// kernel path this CPU runs (scalar, avx2, avx512), with NaN, Inf, huge
// and subnormal gradients among normal ones, a grad_scale that overflows
// some scaled gradients, and the count of elements left unchanged; the sum
// of squares and its non-finite flag against st_grad_sumsq() at sizes from
// 0 to over 256 chunks (the final pass's staging) with NaN and Inf. Every
// output starts as NaN poison, so an element the kernels miss shows up.
// Needs no GPU and no nvcc (tests/cuda/cuda_emu.h).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <vector>

extern "C" {
#include "strata/optim.h"
}

#include "cuda_emu.h"

#define __shared__ EMU_STATIC_SHARED

#include "optim_kernels.cuh"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static float rng_uniform(float lo, float hi)
{
	return lo + (hi - lo) * (float)((rng_next() >> 40) * (1.0 / 16777216.0));
}

static int fails;

template <typename U>
static void expect_bits(const char *what, const U *got, const U *ref, size_t n)
{
	size_t bad = 0, first = 0;

	for (size_t i = 0; i < n; i++)
		if (memcmp(&got[i], &ref[i], sizeof(U)) != 0 && bad++ == 0)
			first = i;
	if (bad) {
		uint64_t a = 0, b = 0;
		memcpy(&a, &got[first], sizeof(U));
		memcpy(&b, &ref[first], sizeof(U));
		fprintf(stderr, "FAIL %s: %zu of %zu differ (first at %zu: emu 0x%llx cpu 0x%llx)\n",
			what, bad, n, first, (unsigned long long)a, (unsigned long long)b);
		fails++;
		return;
	}
	if (!getenv("ST_QUIET"))
		printf("ok   %-52s n=%-8zu bit for bit\n", what, n);
}

/* G with specials every so often when `specials`: NaN, +-Inf, huge,
 * subnormal. */
static std::vector<float> make_g(size_t n, bool specials)
{
	std::vector<float> g(n);

	for (size_t i = 0; i < n; i++) {
		g[i] = rng_uniform(-1.0f, 1.0f) * (i % 7 == 0 ? 1e-3f : 1.0f);
		if (!specials)
			continue;
		switch (rng_next() % 97) {
		case 0: g[i] = NAN; break;
		case 1: g[i] = INFINITY; break;
		case 2: g[i] = -INFINITY; break;
		case 3: g[i] = 3e38f; break;            /* finite, overflows when scaled up */
		case 4: g[i] = 1e-40f; break;           /* subnormal */
		default: break;
		}
	}
	return g;
}

enum wkind { W_NONE, W_F32, W_BF16 };

static void check_adam(const char *label, size_t n, enum wkind wk, float grad_scale,
		       bool specials, enum st_optim_path path)
{
	struct st_adam_hparams hp = { 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, grad_scale, 7 };
	struct st_adam_step step;
	std::vector<float> g = make_g(n, specials), p(n), m(n), v(n);
	char what[160];

	for (size_t i = 0; i < n; i++) {
		p[i] = rng_uniform(-0.5f, 0.5f);
		m[i] = rng_uniform(-0.01f, 0.01f);
		v[i] = rng_uniform(0.0f, 1e-4f) * (i % 5 == 0 ? 0.0f : 1.0f);
	}
	if (st_adam_prep(&step, &hp) != 0) {
		fprintf(stderr, "FAIL %s: st_adam_prep\n", label);
		fails++;
		return;
	}
	step.path = path;
	/* the host: st_adam_apply on copies */
	std::vector<float> pr = p, mr = m, vr = v, wr32(n, NAN);
	std::vector<uint16_t> wr16(n, 0xffff);
	struct st_adam_bufs b = { g.data(), ST_OPTIM_F32, pr.data(), mr.data(), vr.data(),
				  wk == W_F32 ? (void *)wr32.data()
				  : wk == W_BF16 ? (void *)wr16.data() : NULL,
				  wk == W_BF16 ? ST_OPTIM_BF16 : ST_OPTIM_F32,
				  ST_OPTIM_STATE_F32, NULL, NULL, NULL, NULL };
	uint64_t bad_ref = 0;
	int rc = st_adam_apply(&step, &b, n, ST_ADAM_GRAD_CHECKED, &bad_ref);

	if (rc != 0 && !(rc == -ERANGE && bad_ref > 0)) {
		fprintf(stderr, "FAIL %s: st_adam_apply %d\n", label, rc);
		fails++;
		return;
	}
	/* the kernel, on the op's constants */
	struct st_adamw_consts c = { step.grad_scale, step.beta1, step.one_minus_beta1,
				     step.beta2, step.one_minus_beta2, step.rsqrt_bc2, step.eps,
				     step.neg_step_size, step.decay };
	std::vector<float> w32(n, NAN);
	std::vector<uint16_t> w16(n, 0xffff);
	unsigned bad = 5; /* added to */

	emu_launch(k_adamw, dim3(opt_grid(n)), dim3(ST_OPT_BLOCK), (const float *)g.data(),
		   p.data(), m.data(), v.data(), wk == W_F32 ? w32.data() : (float *)NULL,
		   wk == W_BF16 ? w16.data() : (uint16_t *)NULL, &bad, c, n);
	snprintf(what, sizeof(what), "%s [%s] P", label, st_optim_path_name(path));
	expect_bits(what, p.data(), pr.data(), n);
	snprintf(what, sizeof(what), "%s [%s] M", label, st_optim_path_name(path));
	expect_bits(what, m.data(), mr.data(), n);
	snprintf(what, sizeof(what), "%s [%s] V", label, st_optim_path_name(path));
	expect_bits(what, v.data(), vr.data(), n);
	if (wk == W_F32) {
		snprintf(what, sizeof(what), "%s [%s] W fp32", label, st_optim_path_name(path));
		expect_bits(what, w32.data(), wr32.data(), n);
	} else if (wk == W_BF16) {
		snprintf(what, sizeof(what), "%s [%s] W bf16", label, st_optim_path_name(path));
		expect_bits(what, w16.data(), wr16.data(), n);
	}
	if (bad != 5 + bad_ref) {
		fprintf(stderr, "FAIL %s: %u elements left unchanged, the host says %llu\n", label,
			bad - 5, (unsigned long long)bad_ref);
		fails++;
	} else if (specials && bad_ref == 0 && n > 200) {
		fprintf(stderr, "FAIL %s: the specials left nothing unchanged\n", label);
		fails++;
	}
}

static void check_sumsq(const char *label, size_t n, bool specials)
{
	std::vector<float> g = make_g(n, specials);
	double ref = -1.0;
	int rc = st_grad_sumsq(g.data(), ST_OPTIM_F32, n, &ref);
	std::vector<st_gsq_part> parts(gsq_chunks(n) + 1);
	st_gsq_part out;
	char what[160];

	memset(parts.data(), 0xff, parts.size() * sizeof(parts[0]));
	memset(&out, 0xff, sizeof(out));
	if (n)
		emu_launch(k_gsq_parts, dim3(gsq_grid(n)), dim3(ST_GSQ_BLOCK), parts.data(),
			   (const float *)g.data(), n);
	emu_launch(k_gsq_final, dim3(1), dim3(ST_GSQ_BLOCK), &out,
		   (const st_gsq_part *)parts.data(), n);
	snprintf(what, sizeof(what), "grad_sumsq %s", label);
	/* a NaN's payload is the hardware's (a GPU's is canonical): only its
	 * class is the contract, as the engine reads the flag */
	if (std::isfinite(ref))
		expect_bits(what, &out.sum, &ref, 1);
	else if (std::isnan(ref) != std::isnan(out.sum) || std::isfinite(out.sum)) {
		fprintf(stderr, "FAIL %s: sum %g, the host's %g\n", what, out.sum, ref);
		fails++;
	}
	if (out.absmax_bits != (rc < 0 ? 1u : 0u) || out.pad != 0) {
		fprintf(stderr, "FAIL %s: nonfinite %u pad %u, st_grad_sumsq returned %d\n", what,
			out.absmax_bits, out.pad, rc);
		fails++;
	}
	if (specials != (rc < 0) && n > 200) {
		fprintf(stderr, "FAIL %s: specials %d but st_grad_sumsq %d\n", what, specials, rc);
		fails++;
	}
}

int main(void)
{
	static const enum st_optim_path paths[] = { ST_OPTIM_PATH_SCALAR, ST_OPTIM_PATH_AVX2,
						    ST_OPTIM_PATH_AVX512 };

	for (enum st_optim_path path : paths) {
		if (!st_optim_path_supported(path))
			continue;
		check_adam("adamw n=1 fp32 W", 1, W_F32, 1.0f, false, path);
		check_adam("adamw n=37 bf16 W", 37, W_BF16, 0.5f, false, path);
		check_adam("adamw n=40000 fp32 W specials", 40000, W_F32, 0.7f, true, path);
		check_adam("adamw n=40000 bf16 W specials", 40000, W_BF16, 1.0f, true, path);
		check_adam("adamw n=33000 no W", 33000, W_NONE, 1.0f, false, path);
		/* grad_scale 1e30: the 3e38s and more overflow once scaled */
		check_adam("adamw n=9000 bf16 W scale 1e30", 9000, W_BF16, 1e30f, true, path);
	}
	/* the sum's order: one chunk, partial chunks, 32+ chunks (two blocks
	 * of pass 1), 300 chunks (two rounds of pass 2's staging) */
	check_sumsq("n=0", 0, false);
	check_sumsq("n=5", 5, false);
	check_sumsq("n=16384", 16384, false);
	check_sumsq("n=16384*41+77", 16384 * 41 + 77, false);
	check_sumsq("n=16384*300+5", 16384 * 300 + 5, false);
	check_sumsq("n=70001 NaN/Inf", 70001, true);
	for (enum st_optim_path path : paths)
		if (st_optim_path_supported(path)) {
			/* the host's path must not change the sum (its contract) */
			st_optim_path_set(path);
			check_sumsq("n=16384*5+3 (host path set)", 16384 * 5 + 3, false);
		}
	if (emu_launch_errors)
		fails++;
	if (fails) {
		fprintf(stderr, "%d failures\n", fails);
		return 1;
	}
	printf("all ok\n");
	return 0;
}
