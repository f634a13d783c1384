// The cuda ops' kernels (src/backend/kernels/cuda/ops_kernels.cuh, the very code nvcc
// compiles for ops.cu) run on the cpu and held to the cpu kernels
// (strata/kernels.h): casts bit for bit, the rest to a relative error of
// 1e-5. Everything but the cuBLASLt matmuls; the column sums behind the
// matmul's dbias are checked against st_cpu_matmul_bwd's dbias, the bias
// fill against st_cpu_matmul_fwd with no input channels. Needs no
// GPU and no nvcc.
//
// Emulation: tests/cuda/cuda_emu.h (a std::thread per CUDA thread, blocks in
// order). The kernels' static __shared__ arrays are filled with 0xff bytes
// (NaN, or -1 as an int) before each block; every output the kernels
// overwrite starts as NaN, so an element they miss shows up as non-finite.
// Grids and blocks come from the .cuh, as ops.cu takes them; the column sum
// runs its two passes as ops.cu's st_cuda_colsum() does.
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

#include "cuda_emu.h"

#define __shared__ EMU_STATIC_SHARED

#include "ops_kernels.cuh"

/* ---- checking ---------------------------------------------------------- */

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

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

static std::vector<float> rand_vec(size_t n, float lo, float hi)
{
	std::vector<float> v(n);
	for (auto &x : v)
		x = rng_uniform(lo, hi);
	return v;
}

static int fails;

// Every element finite and ||got - ref|| / ||ref|| <= 1e-5 (absolute when
// ref is all zero); one FAIL line on stderr if not.
static void expect_close(const char *what, const std::vector<float> &got,
			 const std::vector<float> &ref)
{
	fails += emu_expect_close(what, got, ref, 1e-5);
}

// Bit for bit; one FAIL line if not.
template <typename U>
static void expect_bits(const char *what, const std::vector<U> &got, const std::vector<U> &ref)
{
	size_t bad = 0, first = 0;

	for (size_t i = 0; i < got.size(); i++) {
		if (got[i] != ref[i] && bad++ == 0)
			first = i;
	}
	if (bad || got.size() != ref.size()) {
		fprintf(stderr, "FAIL %s: %zu of %zu differ (first at %zu: emu 0x%llx cpu 0x%llx)\n",
			what, bad, got.size(), first, (unsigned long long)got[first],
			(unsigned long long)ref[first]);
		fails++;
		return;
	}
	if (!getenv("ST_QUIET"))
		printf("ok   %-34s n=%-7zu bit-exact\n", what, got.size());
}

static const char *name(const char *fmt, int a, int b = 0, int c = 0)
{
	static char buf[96];
	snprintf(buf, sizeof(buf), fmt, a, b, c);
	return buf;
}

static const dim3 ELEM(ST_CUDA_ELEM_BLOCK);

/* ---- the ops ------------------------------------------------------------ */

static void check_casts(void)
{
	// f32 -> bf16: specials (signed zeros, infinities, NaNs with payloads
	// and signs, denormals, FLT_MAX and what rounds up into inf, ties),
	// then random bit patterns (every exponent, NaNs included).
	static const uint32_t special[] = {
		0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
		0x7f800001u, 0xff800001u, 0x7fbfffffu, 0x7fffffffu, 0x00000001u, 0x80000001u,
		0x007fffffu, 0x807fffffu, 0x00008000u, 0x00018000u, 0x00007fffu, 0x7f7fffffu,
		0xff7fffffu, 0x7f7f8000u, 0x7f7f7fffu, 0x3f808000u, 0x3f818000u, 0x3f80ffffu,
		0x3f800001u, 0xbf808000u, 0x00800000u, 0x3f7fffffu,
	};
	const size_t n = 4099;
	std::vector<uint32_t> bits(n);
	for (size_t i = 0; i < n; i++)
		bits[i] = i < sizeof(special) / sizeof(special[0]) ? special[i]
								    : (uint32_t)(rng_next() >> 32);
	std::vector<float> in(n);
	memcpy(in.data(), bits.data(), n * sizeof(float));
	std::vector<uint16_t> ref(n), got(n, 0x7fc1);
	st_cpu_f32_to_bf16(ref.data(), in.data(), n);
	emu_launch(k_f32_to_bf16, grid_for(n, ST_CUDA_ELEM_BLOCK), ELEM, got.data(),
		   (const float *)in.data(), n);
	expect_bits("f32_to_bf16", got, ref);

	// bf16 -> f32: every bf16 value.
	const size_t m = 65536;
	std::vector<uint16_t> h(m);
	for (size_t i = 0; i < m; i++)
		h[i] = (uint16_t)i;
	std::vector<float> fref(m), fgot(m, NAN);
	st_cpu_bf16_to_f32(fref.data(), h.data(), m);
	emu_launch(k_bf16_to_f32, grid_for(m, ST_CUDA_ELEM_BLOCK), ELEM, fgot.data(),
		   (const uint16_t *)h.data(), m);
	std::vector<uint32_t> ub(m), rb(m);
	memcpy(ub.data(), fgot.data(), m * sizeof(float));
	memcpy(rb.data(), fref.data(), m * sizeof(float));
	expect_bits("bf16_to_f32 (all 65536)", ub, rb);
}

static void check_elementwise(size_t n)
{
	const unsigned g = grid_for(n, ST_CUDA_ELEM_BLOCK);
	const int ni = (int)n;

	{ /* residual */
		auto a = rand_vec(n, -2, 2), b = rand_vec(n, -2, 2), d = rand_vec(n, -1, 1);
		std::vector<float> ref(n), got(n, NAN);
		st_cpu_residual_fwd(ref.data(), a.data(), b.data(), n);
		emu_launch(k_residual_fwd, g, ELEM, got.data(), (const float *)a.data(),
			   (const float *)b.data(), n);
		expect_close(name("residual_fwd n=%d", ni), got, ref);

		auto ra = a, rb = b, ga = a, gb = b;
		st_cpu_residual_bwd(ra.data(), rb.data(), d.data(), n);
		emu_launch(k_residual_bwd, g, ELEM, ga.data(), gb.data(), (const float *)d.data(),
			   n);
		expect_close(name("residual_bwd da n=%d", ni), ga, ra);
		expect_close(name("residual_bwd db n=%d", ni), gb, rb);

		auto rs = a, gs = a; /* da == db */
		st_cpu_residual_bwd(rs.data(), rs.data(), d.data(), n);
		emu_launch(k_residual_bwd, g, ELEM, gs.data(), gs.data(), (const float *)d.data(),
			   n);
		expect_close(name("residual_bwd da==db n=%d", ni), gs, rs);
	}
	{ /* gelu, with a few saturating inputs */
		auto x = rand_vec(n, -6, 6), d = rand_vec(n, -1, 1);
		x[0] = 100.0f;
		x[1] = -100.0f;
		x[2] = 0.0f;
		std::vector<float> ref(n), got(n, NAN);
		st_cpu_gelu_fwd(ref.data(), x.data(), n);
		emu_launch(k_gelu_fwd, g, ELEM, got.data(), (const float *)x.data(), n);
		expect_close(name("gelu_fwd n=%d", ni), got, ref);

		std::vector<float> dref(n), dgot(n, NAN);
		st_cpu_gelu_bwd(dref.data(), x.data(), d.data(), n);
		emu_launch(k_gelu_bwd, g, ELEM, dgot.data(), (const float *)x.data(),
			   (const float *)d.data(), n);
		expect_close(name("gelu_bwd n=%d", ni), dgot, dref);

		auto inplace = d; /* dinp == dout */
		emu_launch(k_gelu_bwd, g, ELEM, inplace.data(), (const float *)x.data(),
			   (const float *)inplace.data(), n);
		expect_close(name("gelu_bwd in place n=%d", ni), inplace, dref);
	}
	{ /* bias + GELU in one pass (matmul_gelu_fwd without a fused-bias
	   * algorithm): the bias then the gelu, pre exact, in place too */
		const int OC = n % 7 == 0 ? 7 : 5;
		const size_t N = n / OC, m = N * OC;
		auto acc = rand_vec(m, -4, 4), bias = rand_vec(OC, -2, 2);
		std::vector<float> vref(m), ref(m), got(m, NAN), pre(m, NAN);
		for (size_t i = 0; i < m; i++)
			vref[i] = acc[i] + bias[i % OC];
		st_cpu_gelu_fwd(ref.data(), vref.data(), m);
		emu_launch(k_bias_gelu_fwd, g, ELEM, got.data(), pre.data(),
			   (const float *)acc.data(), (const float *)bias.data(), N, OC);
		expect_close(name("bias_gelu_fwd n=%d", ni), got, ref);
		expect_bits(name("bias_gelu_fwd pre n=%d", ni), pre, vref);
		auto inplace = acc; /* pre == acc, out elsewhere */
		std::vector<float> got2(m, NAN);
		emu_launch(k_bias_gelu_fwd, g, ELEM, got2.data(), inplace.data(),
			   (const float *)inplace.data(), (const float *)bias.data(), N, OC);
		expect_close(name("bias_gelu_fwd in place n=%d", ni), got2, ref);
		expect_bits(name("bias_gelu_fwd in place pre n=%d", ni), inplace, vref);
		auto outplace = acc; /* out == acc, no pre */
		emu_launch(k_bias_gelu_fwd, g, ELEM, outplace.data(), (float *)NULL,
			   (const float *)outplace.data(), (const float *)bias.data(), N, OC);
		expect_close(name("bias_gelu_fwd out == acc n=%d", ni), outplace, ref);
	}
}

// ops.cu's st_cuda_colsum(), launched the same way; the partial sums start as NaN.
static void emu_colsum(float *out1, float *out2, const float *g, const float *inp,
		       const float *mean, const float *rstd, int N, int C)
{
	if (N == 0 || C == 0 || (!out1 && !out2))
		return;
	const int n_chunks = colsum_chunks(N);
	const size_t part_elems = (size_t)n_chunks * C;
	std::vector<float> scratch(2 * part_elems, NAN);
	float *p1 = scratch.data(), *p2 = p1 + part_elems;
	emu_launch(k_colsum_partial<float>, colsum_grid(C, n_chunks), colsum_block(), p1,
		   inp ? p2 : (float *)NULL, g, inp, mean, rstd, N, C, n_chunks);
	const unsigned fg = grid_for((size_t)C, ST_CUDA_ELEM_BLOCK);
	if (out1)
		emu_launch(k_colsum_final, fg, ELEM, out1, (const float *)p1, C, n_chunks);
	if (out2 && inp)
		emu_launch(k_colsum_final, fg, ELEM, out2, (const float *)p2, C, n_chunks);
}

static void check_dbias(int N, int OC)
{
	const int IC = 3;
	auto dout = rand_vec((size_t)N * OC, -1, 1), inp = rand_vec((size_t)N * IC, -1, 1);
	auto weight = rand_vec((size_t)IC * OC, -1, 1), dbias = rand_vec((size_t)OC, -1, 1);
	auto ref = dbias, got = dbias;
	st_cpu_matmul_bwd(NULL, NULL, ref.data(), dout.data(), inp.data(), weight.data(), N, IC,
			  OC);
	emu_colsum(got.data(), NULL, dout.data(), NULL, NULL, NULL, N, OC);
	expect_close(name("matmul_bwd dbias (%d,%d)", N, OC), got, ref);
}

// k_fill_rows is st_cuda_matmul_fwd at IC == 0 (rows = bias, or 0).
static void check_fill_rows(int N, int OC)
{
	const size_t n = (size_t)N * OC;
	auto bias = rand_vec((size_t)OC, -1, 1);
	const float dummy = 0.0f; /* inp (N,0), weight (0,OC) */

	for (int with_bias = 0; with_bias < 2; with_bias++) {
		const float *b = with_bias ? bias.data() : NULL;
		std::vector<float> ref(n, NAN), got(n, NAN);
		st_cpu_matmul_fwd(ref.data(), &dummy, &dummy, b, N, 0, OC);
		emu_launch(k_fill_rows, grid_for(n, ST_CUDA_ELEM_BLOCK), ELEM, got.data(), b,
			   (size_t)N, OC);
		expect_close(with_bias ? name("matmul_fwd IC=0 bias (%d,%d)", N, OC)
				       : name("matmul_fwd IC=0 (%d,%d)", N, OC),
			     got, ref);
	}
}

// k_scale is st_cuda_gemm at K == 0: C = beta * C in an (M,N) window of
// rows ldc apart (columns past N untouched); beta 0 writes zeros, NaN too.
static void check_gemm_k0(int M, int N, int ldc)
{
	static const float betas[] = {0.0f, 1.0f, -0.5f};

	for (float beta : betas) {
		auto c0 = rand_vec((size_t)M * ldc, -1, 1);
		c0[0] = NAN;
		std::vector<float> ref = c0, got = c0;
		const float dummy = 0.0f; /* A (M,0), B (0,N) */
		st_cpu_sgemm(0, 0, M, N, 0, 1.0f, &dummy, 1, &dummy, N, beta, ref.data(), ldc);
		emu_launch(k_scale, grid_for((size_t)M * N, ST_CUDA_ELEM_BLOCK), ELEM, got.data(),
			   beta, M, N, ldc);
		if (beta != 0.0f) { /* NaN * beta stays NaN in both: compare the rest */
			ref[0] = got[0] = 0.0f;
		}
		char what[64];
		snprintf(what, sizeof(what), "gemm K=0 beta %g (%d,%d) ldc %d", (double)beta, M,
			 N, ldc);
		expect_close(what, got, ref);
	}
}

static void check_layernorm(int N, int C)
{
	const size_t n = (size_t)N * C;
	auto inp = rand_vec(n, -3, 3), w = rand_vec((size_t)C, 0.5f, 1.5f);
	auto b = rand_vec((size_t)C, -1, 1), dout = rand_vec(n, -1, 1);
	std::vector<float> out(n), mean(N), rstd(N);
	std::vector<float> gout(n, NAN), gmean(N, NAN), grstd(N, NAN);

	st_cpu_layernorm_fwd(out.data(), mean.data(), rstd.data(), inp.data(), w.data(),
			     b.data(), N, C);
	emu_launch(k_layernorm_fwd, grid_warp_rows(N), dim3(ST_CUDA_ROW_BLOCK), gout.data(),
		   gmean.data(), grstd.data(), (const float *)inp.data(), (const float *)w.data(),
		   (const float *)b.data(), N, C);
	expect_close(name("layernorm_fwd out (%d,%d)", N, C), gout, out);
	expect_close(name("layernorm_fwd mean (%d,%d)", N, C), gmean, mean);
	expect_close(name("layernorm_fwd rstd (%d,%d)", N, C), grstd, rstd);

	// Both backwards from the cpu forward's mean and rstd; they accumulate.
	auto dinp = rand_vec(n, -1, 1), dw = rand_vec((size_t)C, -1, 1);
	auto db = rand_vec((size_t)C, -1, 1);
	auto gdinp = dinp, gdw = dw, gdb = db;
	st_cpu_layernorm_bwd(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
			     mean.data(), rstd.data(), N, C);
	emu_launch(k_layernorm_bwd_dinp, grid_warp_rows(N), dim3(ST_CUDA_ROW_BLOCK),
		   gdinp.data(), (const float *)dout.data(), (const float *)inp.data(),
		   (const float *)w.data(), (const float *)mean.data(),
		   (const float *)rstd.data(), N, C);
	/* as st_cuda_layernorm_bwd: colsum(dbias, dweight, ...) */
	emu_colsum(gdb.data(), gdw.data(), dout.data(), inp.data(), mean.data(), rstd.data(), N,
		   C);
	expect_close(name("layernorm_bwd dinp (%d,%d)", N, C), gdinp, dinp);
	expect_close(name("layernorm_bwd dweight (%d,%d)", N, C), gdw, dw);
	expect_close(name("layernorm_bwd dbias (%d,%d)", N, C), gdb, db);
}

/* The fused residual + norm kernels: bit for bit the unfused pair
 * (k_residual_fwd then k_layernorm_fwd / k_rmsnorm_fwd, both emulated),
 * and within 1e-5 of the cpu's residual then norm; res is a's buffer
 * (aliased, as the models' second residual is not, but may be). */
static void check_residual_norm(int N, int C, bool alias)
{
	const size_t n = (size_t)N * C;
	auto a = rand_vec(n, -3, 3), bb = rand_vec(n, -3, 3), w = rand_vec((size_t)C, 0.5f, 1.5f);
	auto bias = rand_vec((size_t)C, -1, 1);
	for (int rms = 0; rms < 2; rms++) {
		std::vector<float> res(n), out(n), mean(N), rstd(N);
		std::vector<float> ures(n, NAN), uout(n, NAN), umean(N, NAN), urstd(N, NAN);
		std::vector<float> fres(alias ? a : std::vector<float>(n, NAN)), fout(n, NAN),
			fmean(N, NAN), frstd(N, NAN);
		const float *fa = alias ? fres.data() : a.data();

		st_cpu_residual_fwd(res.data(), a.data(), bb.data(), n);
		if (rms)
			st_cpu_rmsnorm_fwd(out.data(), rstd.data(), res.data(), w.data(), 1e-6f, N, C);
		else
			st_cpu_layernorm_fwd(out.data(), mean.data(), rstd.data(), res.data(), w.data(),
					     bias.data(), N, C);
		emu_launch(k_residual_fwd, dim3(grid_for(n, ST_CUDA_ELEM_BLOCK)),
			   dim3(ST_CUDA_ELEM_BLOCK), ures.data(), (const float *)a.data(),
			   (const float *)bb.data(), n);
		if (rms) {
			emu_launch(k_rmsnorm_fwd<float, float>, grid_warp_rows(N), dim3(ST_CUDA_ROW_BLOCK),
				   uout.data(), urstd.data(), (const float *)ures.data(),
				   (const float *)w.data(), 1e-6f, N, C);
			emu_launch(k_residual_rmsnorm_fwd<float, float>, grid_warp_rows(N), dim3(ST_CUDA_ROW_BLOCK),
				   fres.data(), fout.data(), frstd.data(), fa, (const float *)bb.data(),
				   (const float *)w.data(), 1e-6f, N, C);
		} else {
			emu_launch(k_layernorm_fwd, grid_warp_rows(N), dim3(ST_CUDA_ROW_BLOCK),
				   uout.data(), umean.data(), urstd.data(), (const float *)ures.data(),
				   (const float *)w.data(), (const float *)bias.data(), N, C);
			emu_launch(k_residual_layernorm_fwd, grid_warp_rows(N),
				   dim3(ST_CUDA_ROW_BLOCK), fres.data(), fout.data(), fmean.data(),
				   frstd.data(), fa, (const float *)bb.data(), (const float *)w.data(),
				   (const float *)bias.data(), N, C);
			expect_bits(name("residual_layernorm_fwd mean = unfused (%d,%d)", N, C),
				    fmean, umean);
			expect_close(name("residual_layernorm_fwd mean (%d,%d)", N, C), fmean, mean);
		}
		const char *k = rms ? "residual_rmsnorm_fwd" : "residual_layernorm_fwd";
		char what[96];
		snprintf(what, sizeof(what), "%s%s res = unfused (%d,%d)", k,
			 alias ? " (res = a)" : "", N, C);
		expect_bits(what, fres, ures);
		snprintf(what, sizeof(what), "%s out = unfused (%d,%d)", k, N, C);
		expect_bits(what, fout, uout);
		snprintf(what, sizeof(what), "%s rstd = unfused (%d,%d)", k, N, C);
		expect_bits(what, frstd, urstd);
		snprintf(what, sizeof(what), "%s out (%d,%d)", k, N, C);
		expect_close(what, fout, out);
		snprintf(what, sizeof(what), "%s res (%d,%d)", k, N, C);
		expect_close(what, fres, res);
	}
}

static void check_embedding(int B, int T, int C, int V)
{
	const size_t n = (size_t)B * T * C;
	const int BT = B * T;
	std::vector<int32_t> tokens(BT);
	for (auto &t : tokens)
		t = (int32_t)(rng_next() % (uint64_t)V);
	auto wte = rand_vec((size_t)V * C, -1, 1), wpe = rand_vec((size_t)T * C, -1, 1);
	auto dout = rand_vec(n, -1, 1);
	std::vector<float> out(n), gout(n, NAN);

	st_cpu_embedding_fwd(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
	emu_launch(k_embedding_fwd, grid_for(n, ST_CUDA_ELEM_BLOCK), ELEM, gout.data(),
		   (const int32_t *)tokens.data(), (const float *)wte.data(),
		   (const float *)wpe.data(), T, C, n);
	expect_close(name("embedding_fwd (%d,%d,%d)", B, T, C), gout, out);

	auto dwte = rand_vec((size_t)V * C, -1, 1), dwpe = rand_vec((size_t)T * C, -1, 1);
	auto gdwte = dwte, gdwpe = dwpe;
	st_cpu_embedding_bwd(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
	emu_launch(k_embedding_bwd_wte, grid_block_items(BT), dim3(ST_CUDA_EMB_BLOCK),
		   gdwte.data(), (const float *)dout.data(), (const int32_t *)tokens.data(), BT,
		   C);
	emu_launch(k_embedding_bwd_wpe, grid_for((size_t)T * C, ST_CUDA_ELEM_BLOCK), ELEM,
		   gdwpe.data(), (const float *)dout.data(), B, T, C);
	expect_close(name("embedding_bwd dwte (%d,%d,%d)", B, T, C), gdwte, dwte);
	expect_close(name("embedding_bwd dwpe (%d,%d,%d)", B, T, C), gdwpe, dwpe);
}

/* masked: every third target -1 (ignored: loss 0, dlogits row 0) */
static void check_crossentropy(int N, int V, bool masked)
{
	const size_t n = (size_t)N * V;
	const float dloss = 0.37f;
	std::vector<int32_t> targets(N);
	for (auto &t : targets)
		t = (int32_t)(rng_next() % (uint64_t)V);
	for (int i = 0; masked && i < N; i += 3)
		targets[i] = -1;
	auto logits = rand_vec(n, -8, 8);
	std::vector<float> losses(N), glosses(N, NAN);
	const dim3 grid(grid_block_items(N)), block(ST_CUDA_CE_BLOCK);

	st_cpu_crossentropy_fwd(losses.data(), logits.data(), targets.data(), N, V);
	emu_launch(k_crossentropy_fwd, grid, block, glosses.data(), (const float *)logits.data(),
		   (const int32_t *)targets.data(), N, V);
	expect_close(name("crossentropy_fwd (%d,%d)", N, V), glosses, losses);

	std::vector<float> dl(n), bl(N), gdl(n, NAN), gbl(N, NAN);
	st_cpu_crossentropy_bwd(dl.data(), bl.data(), logits.data(), targets.data(), dloss, N, V);
	emu_launch(k_crossentropy_bwd, grid, block, gdl.data(), gbl.data(),
		   (const float *)logits.data(), (const int32_t *)targets.data(), dloss, N, V);
	expect_close(name("crossentropy_bwd dlogits (%d,%d)", N, V), gdl, dl);
	expect_close(name("crossentropy_bwd losses (%d,%d)", N, V), gbl, bl);

	auto inplace = logits; /* dlogits == logits, no losses */
	emu_launch(k_crossentropy_bwd, grid, block, inplace.data(), (float *)NULL,
		   (const float *)inplace.data(), (const int32_t *)targets.data(), dloss, N, V);
	expect_close(name("crossentropy_bwd in place (%d,%d)", N, V), inplace, dl);
	if (masked) { /* the cpu's ignored rows: exactly 0 (the emulation matched it) */
		std::vector<float> zl(N, 0.0f), zd(n, 0.0f), l0(N), d0(n);
		for (int i = 0; i < N; i++) {
			l0[i] = targets[i] < 0 ? losses[i] : 0.0f;
			for (int v = 0; v < V; v++)
				d0[(size_t)i * V + v] = targets[i] < 0 ? dl[(size_t)i * V + v] : 0.0f;
		}
		expect_close(name("crossentropy ignored losses 0 (%d,%d)", N, V), l0, zl);
		expect_close(name("crossentropy ignored dlogits 0 (%d,%d)", N, V), d0, zd);
	}
}

/* ---- LLaMA's ops ----------------------------------------------------------- */

static void check_rmsnorm(int N, int C)
{
	const size_t n = (size_t)N * C;
	auto inp = rand_vec(n, -3, 3), w = rand_vec((size_t)C, 0.5f, 1.5f);
	auto dout = rand_vec(n, -1, 1);
	std::vector<float> out(n), rstd(N), gout(n, NAN), grstd(N, NAN);

	st_cpu_rmsnorm_fwd(out.data(), rstd.data(), inp.data(), w.data(), 1e-6f, N, C);
	emu_launch(k_rmsnorm_fwd<float, float>, grid_warp_rows(N), dim3(ST_CUDA_ROW_BLOCK), gout.data(),
		   grstd.data(), (const float *)inp.data(), (const float *)w.data(), 1e-6f, N, C);
	expect_close(name("rmsnorm_fwd out (%d,%d)", N, C), gout, out);
	expect_close(name("rmsnorm_fwd rstd (%d,%d)", N, C), grstd, rstd);

	auto dinp = rand_vec(n, -1, 1), dw = rand_vec((size_t)C, -1, 1);
	auto gdinp = dinp, gdw = dw;
	st_cpu_rmsnorm_bwd(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), rstd.data(),
			   N, C);
	emu_launch(k_rmsnorm_bwd_dinp<float, float>, grid_warp_rows(N), dim3(ST_CUDA_ROW_BLOCK), gdinp.data(),
		   (const float *)dout.data(), (const float *)inp.data(), (const float *)w.data(),
		   (const float *)rstd.data(), N, C);
	/* as st_cuda_rmsnorm_bwd: colsum(NULL, dweight, ..., mean NULL) */
	emu_colsum(NULL, gdw.data(), dout.data(), inp.data(), NULL, rstd.data(), N, C);
	expect_close(name("rmsnorm_bwd dinp (%d,%d)", N, C), gdinp, dinp);
	expect_close(name("rmsnorm_bwd dweight (%d,%d)", N, C), gdw, dw);
}

// rows of `stride` floats, NH heads of hd first; the rest left alone.
static void check_rope(int B, int T, int NH, int hd, int stride, int type, int pos0)
{
	const size_t n = (size_t)B * T * stride, pairs = (size_t)B * T * NH * (hd / 2);
	const float theta = 500000.0f, factor = type ? 8.0f : 0.0f;
	const float lo = type == 2 ? 1.0f : 0.0f, hi = type == 2 ? 4.0f : 0.0f;
	const int orig = type == 2 ? 16 : 0;
	auto inp = rand_vec(n, -1, 1);
	for (int bwd = 0; bwd < 2; bwd++) {
		auto ref = rand_vec(n, -1, 1);
		auto got = ref;
		if (bwd)
			st_cpu_rope_bwd(ref.data(), inp.data(), B, T, pos0, NH, hd, stride, type, orig,
					theta, factor, lo, hi);
		else
			st_cpu_rope_fwd(ref.data(), inp.data(), B, T, pos0, NH, hd, stride, type, orig,
					theta, factor, lo, hi);
		emu_launch(k_rope<float>, grid_for(pairs, ST_CUDA_ELEM_BLOCK), ELEM, got.data(),
			   (const float *)inp.data(), T, pos0, NH, hd, stride, pairs, type, orig, theta,
			   factor, lo, hi, bwd ? -1.0f : 1.0f);
		expect_close(name(bwd ? "rope_bwd type %d (%d,%d)" : "rope_fwd type %d (%d,%d)",
				  type, T, hd), got, ref);
	}
	auto inplace = inp, ref = inp; /* out == inp */
	st_cpu_rope_fwd(ref.data(), inp.data(), B, T, pos0, NH, hd, stride, type, orig, theta, factor,
			lo, hi);
	emu_launch(k_rope<float>, grid_for(pairs, ST_CUDA_ELEM_BLOCK), ELEM, inplace.data(),
		   (const float *)inplace.data(), T, pos0, NH, hd, stride, pairs, type, orig, theta,
		   factor, lo, hi, 1.0f);
	expect_close(name("rope_fwd in place type %d (%d,%d)", type, T, hd), inplace, ref);
}

static void check_swiglu(size_t n)
{
	auto gate = rand_vec(n, -8, 8), up = rand_vec(n, -2, 2), dout = rand_vec(n, -1, 1);
	std::vector<float> out(n), gout(n, NAN);
	st_cpu_swiglu_fwd(out.data(), gate.data(), up.data(), n);
	emu_launch(k_swiglu_fwd<float>, grid_for(n, ST_CUDA_ELEM_BLOCK), ELEM, gout.data(),
		   (const float *)gate.data(), (const float *)up.data(), n);
	expect_close(name("swiglu_fwd n=%d", (int)n), gout, out);
	std::vector<float> dg(n), du(n), gdg(n, NAN), gdu(n, NAN);
	st_cpu_swiglu_bwd(dg.data(), du.data(), dout.data(), gate.data(), up.data(), n);
	emu_launch(k_swiglu_bwd<float>, grid_for(n, ST_CUDA_ELEM_BLOCK), ELEM, gdg.data(), gdu.data(),
		   (const float *)dout.data(), (const float *)gate.data(),
		   (const float *)up.data(), n);
	expect_close(name("swiglu_bwd dgate n=%d", (int)n), gdg, dg);
	expect_close(name("swiglu_bwd dup n=%d", (int)n), gdu, du);
	auto ig = gate, iu = up; /* in place: dgate = gate, dup = up */
	emu_launch(k_swiglu_bwd<float>, grid_for(n, ST_CUDA_ELEM_BLOCK), ELEM, ig.data(), iu.data(),
		   (const float *)dout.data(), (const float *)ig.data(), (const float *)iu.data(),
		   n);
	expect_close(name("swiglu_bwd in place n=%d", (int)n), ig, dg);
}

static void check_token_embed(int N, int C, int V)
{
	std::vector<int32_t> tok(N);
	for (auto &t : tok)
		t = (int32_t)(rng_next() % (uint64_t)V);
	auto wte = rand_vec((size_t)V * C, -1, 1), dout = rand_vec((size_t)N * C, -1, 1);
	std::vector<float> out((size_t)N * C), gout((size_t)N * C, NAN);
	st_cpu_token_embed_fwd(out.data(), tok.data(), wte.data(), N, C);
	emu_launch(k_token_embed_fwd<float>, grid_for((size_t)N * C, ST_CUDA_ELEM_BLOCK), ELEM,
		   gout.data(), (const int32_t *)tok.data(), (const float *)wte.data(), C,
		   (size_t)N * C);
	expect_bits(name("token_embed_fwd (%d,%d)", N, C), gout, out);
	auto dw = rand_vec((size_t)V * C, -1, 1);
	auto gdw = dw;
	st_cpu_token_embed_bwd(dw.data(), dout.data(), tok.data(), N, C);
	emu_launch(k_embedding_bwd_wte, grid_block_items(N), dim3(ST_CUDA_EMB_BLOCK), gdw.data(),
		   (const float *)dout.data(), (const int32_t *)tok.data(), N, C);
	expect_close(name("token_embed_bwd (%d,%d) V=%d", N, C, V), gdw, dw);
}

// The decoder's attention: n rows at pos.. over a cache of pos + n rows,
// NH query heads over NKV kv heads of hd (hd past a warp, and not a multiple
// of 32), q rows of sq floats.
static void check_decode_attention(int n, int pos, int NH, int NKV, int hd)
{
	const int sq = NH * hd + 5, skv = NKV * hd, T = pos + n;
	auto q = rand_vec((size_t)n * sq, -2, 2), kc = rand_vec((size_t)T * skv, -2, 2);
	auto vc = rand_vec((size_t)T * skv, -1, 1);
	std::vector<float> ref((size_t)n * NH * hd), got(ref.size(), NAN);

	st_cpu_decode_attention(ref.data(), q.data(), kc.data(), vc.data(), n, pos, NH, NKV, hd,
				sq);
	emu_launch(k_decode_attention, dim3((unsigned)NH, (unsigned)n),
		   dim3(32 * ST_CUDA_DEC_WARPS), got.data(), (const float *)q.data(),
		   (const float *)kc.data(), (const float *)vc.data(), pos, NH, NKV, hd, sq);
	char what[96];

	snprintf(what, sizeof(what), "decode_attention n %d at %d, %d/%d heads of %d", n, pos, NH,
		 NKV, hd);
	expect_close(what, got, ref);
}

int main(void)
{
	check_casts();
	check_elementwise(1001);
	check_elementwise(37);
	// Odd column counts (partial column tiles), one and several row chunks.
	check_dbias(300, 37);
	check_dbias(5, 70);
	check_dbias(600, 33);
	check_fill_rows(13, 37);
	check_gemm_k0(7, 5, 9);
	check_layernorm(300, 37);
	check_layernorm(5, 70);
	check_layernorm(3, 1);
	check_residual_norm(300, 37, false);
	check_residual_norm(5, 770, true);
	// Repeated tokens; B*T > the block (the leader's list in several rounds).
	check_embedding(2, 7, 37, 5);
	check_embedding(2, 150, 5, 3);
	// V above and below the block.
	check_crossentropy(5, 1001, false);
	check_crossentropy(3, 37, false);
	check_crossentropy(7, 1001, true);
	// LLaMA's: rows past a warp, C odd; rope with spare row floats, each
	// type; SwiGLU over the exp's clamps; repeated tokens past the block.
	check_rmsnorm(300, 37);
	check_rmsnorm(5, 70);
	check_rope(2, 37, 3, 16, 56, 0, 0);
	check_rope(1, 300, 2, 8, 16, 1, 0);
	check_rope(1, 70, 2, 64, 130, 2, 0);
	check_rope(1, 3, 2, 64, 130, 2, 211); /* the decoder's rows, at 211.. */
	check_swiglu(1001);
	check_token_embed(150, 37, 5);
	// The decoder's: a prompt (keys fewer than the warps for its first
	// rows), one token far along, GQA, heads up to the 256 bound.
	check_decode_attention(6, 0, 4, 2, 24);
	check_decode_attention(1, 300, 2, 1, 64);
	check_decode_attention(3, 41, 6, 3, 70);
	check_decode_attention(2, 9, 2, 2, 256);
	if (emu_launch_errors) {
		fprintf(stderr, "FAIL %d launches beyond the emulation\n", emu_launch_errors);
		fails++;
	}
	return fails ? 1 : 0;
}
