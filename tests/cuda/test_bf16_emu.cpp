// The cuda bf16 ops' kernels (src/backend/kernels/cuda/bf16_kernels.cuh, and
// LLaMA's templated kernels of ops_kernels.cuh at bf16: the code nvcc
// compiles for bf16.cu) run on the cpu through tests/cuda/cuda_emu.h
// and held to the cpu compute's bf16 ops (kernels_bf16.h: the fp32
// kernels on widened operands, outputs rounded once): bf16 outputs within
// one bf16 ulp of the cpu's (a different fp32 summation order may cross a
// rounding boundary) and, in relative L2 norm, within 2^-8; fp32 outputs
// to 1e-5. Outputs start as NaN, so a missed element shows. The column
// sums (dbias, the norms' dweight) are ops.cu's two passes over a bf16 or
// fp32 dout, held to the cpu at 1e-5 and to the one-thread-a-column sums
// they replaced: bit for bit where the order is the same (a plain sum of
// at most ST_CUDA_COL_LANES rows), else 1e-5. The cuBLASLt
// matmuls cannot run here: tests/cuda/test_cuda_bf16.c holds them on a GPU.
// Needs no GPU and no nvcc.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <vector>

extern "C" {
#include "strata/compute.h"
#include "strata/kernels.h"
}

#include "cuda_emu.h"

#define __shared__ EMU_STATIC_SHARED

#include "ops_kernels.cuh"
#include "bf16_kernels.cuh"

typedef std::vector<uint16_t> vb;
typedef std::vector<float> vf;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static int fails;

static float urand(float s)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return s * ((float)(rng >> 40) / 8388608.0f - 1.0f);
}

static vb rb(size_t n, float s)
{
	vb v(n);
	for (auto &x : v)
		x = st_cpu_bf16_from_f32(urand(s));
	return v;
}

static vf rf(size_t n, float s)
{
	vf v(n);
	for (auto &x : v)
		x = urand(s);
	return v;
}

static vb nan_b(size_t n)
{
	return vb(n, 0x7fc0);
}

static vf nan_f(size_t n)
{
	return vf(n, NAN);
}

static float wid(uint16_t h)
{
	return st_cpu_f32_from_bf16(h);
}

static void close_b(const char *what, const vb &got, const vb &ref)
{
	double num = 0, den = 0;
	size_t off = 0, first = 0;

	for (size_t i = 0; i < got.size(); i++) {
		double g = wid(got[i]), r = wid(ref[i]);
		int d = (int)got[i] - (int)ref[i];
		if (!std::isfinite(g) || ((got[i] ^ ref[i]) & 0x8000 && g != r) || d > 1 || d < -1)
			if (off++ == 0)
				first = i;
		num += (g - r) * (g - r);
		den += r * r;
	}
	double rel = den > 0 ? sqrt(num / den) : sqrt(num);
	if (off || !(rel <= 0x1p-8)) {
		fprintf(stderr, "FAIL %s: %zu of %zu more than one bf16 ulp off (first %zu: emu %g cpu %g), rel %.3g\n",
			what, off, got.size(), first, (double)wid(got[first]), (double)wid(ref[first]),
			rel);
		fails++;
		return;
	}
	if (!getenv("ST_QUIET"))
		printf("ok   %-34s n=%-7zu rel %.2e (bf16)\n", what, got.size(), rel);
}

static void close_f(const char *what, const vf &got, const vf &ref)
{
	fails += emu_expect_close(what, got, ref, 1e-5);
}

static void cpu(struct st_op op)
{
	st_compute_run(st_compute_cpu(), &op);
	if (st_compute_take_error(st_compute_cpu())) {
		fprintf(stderr, "FAIL cpu %s: %s\n", st_op_name(op.kind), st_error_last());
		fails++;
	}
}

#define TB(v) st_tensor_1d((v).data(), ST_DTYPE_BF16, (int64_t)(v).size())
#define TF(v) st_tensor_1d((v).data(), ST_DTYPE_F32, (int64_t)(v).size())

static const dim3 ELEM(ST_CUDA_ELEM_BLOCK), ROW(ST_CUDA_ROW_BLOCK);

// ops.cu's st_cuda_colsum() over a bf16 or fp32 g, launched the same way;
// the partial sums start as NaN (a chunk not written shows).
template <typename TG>
static void emu_colsum(float *out1, float *out2, const TG *g, const float *inp,
		       const float *mean, const float *rstd, int N, int C)
{
	if (N == 0 || C == 0 || (!out1 && !out2))
		return;
	const int n_chunks = colsum_chunks(N);
	const size_t part_elems = (size_t)n_chunks * C;
	std::vector<float> scratch(2 * part_elems, NAN);
	float *p1 = scratch.data(), *p2 = p1 + part_elems;
	emu_launch(k_colsum_partial<TG>, colsum_grid(C, n_chunks), colsum_block(), p1,
		   inp ? p2 : (float *)NULL, g, inp, mean, rstd, N, C, n_chunks);
	const unsigned fg = grid_for((size_t)C, ST_CUDA_ELEM_BLOCK);
	if (out1)
		emu_launch(k_colsum_final, fg, ELEM, out1, (const float *)p1, C, n_chunks);
	if (out2 && inp)
		emu_launch(k_colsum_final, fg, ELEM, out2, (const float *)p2, C, n_chunks);
}

// What the bf16 path ran before the two passes: one thread a column, the
// rows in order (out1 += sum g; out2 += sum g * (inp - mean) * rstd).
template <typename TG>
static void rows_colsum(float *out1, float *out2, const TG *g, const float *inp,
			const float *mean, const float *rstd, int N, int C)
{
	for (int c = 0; c < C; c++) {
		float sw = 0.0f, sb = 0.0f;
		for (int n = 0; n < N; n++) {
			size_t i = (size_t)n * C + c;
			float gv = ld_f(g, i);
			if (inp)
				sw += gv * (mean ? inp[i] - mean[n] : inp[i]) * rstd[n];
			sb += gv;
		}
		if (out1)
			out1[c] += sb;
		if (out2 && inp)
			out2[c] += sw;
	}
}

// got and ref the same bits
static void same_bits(const char *what, const vf &got, const vf &ref)
{
	if (got.size() != ref.size() || memcmp(got.data(), ref.data(), 4 * got.size())) {
		fprintf(stderr, "FAIL %s: not the same bits\n", what);
		fails++;
		return;
	}
	if (!getenv("ST_QUIET"))
		printf("ok   %-34s n=%-7zu bit for bit\n", what, got.size());
}

static void check_layernorm(int N, int C)
{
	vf x = rf((size_t)N * C, 2.0f);
	vb w = rb(C, 1.0f), b = rb(C, 0.5f);
	vb out = nan_b((size_t)N * C), rout = nan_b((size_t)N * C);
	vf mean = nan_f(N), rstd = nan_f(N), rmean = nan_f(N), rrstd = nan_f(N);

	emu_launch(k_layernorm_fwd_b, grid_warp_rows(N), ROW, out.data(), mean.data(), rstd.data(),
		   (const float *)x.data(), (const uint16_t *)w.data(), (const uint16_t *)b.data(),
		   N, C);
	cpu({ .kind = ST_OP_LAYERNORM_FWD, .t = { TB(rout), TF(rmean), TF(rrstd), TF(x), TB(w), TB(b) },
	      .i = { N, C } });
	close_b("layernorm_fwd bfffbb out", out, rout);
	close_f("layernorm_fwd bfffbb mean", mean, rmean);
	close_f("layernorm_fwd bfffbb rstd", rstd, rrstd);

	// backward, dout bf16 and fp32: dinp, dweight, dbias accumulate
	for (int df = 0; df < 2; df++) {
		vb doutb = rb((size_t)N * C, 1.0f);
		vf doutf = rf((size_t)N * C, 1.0f);
		vf dx = rf((size_t)N * C, 0.5f), dw = rf(C, 0.5f), db = rf(C, 0.5f);
		vf rdx = dx, rdw = dw, rdb = db, odw = dw, odb = db;

		if (df) {
			emu_launch(k_layernorm_bwd_dinp_b<float>, grid_warp_rows(N), ROW, dx.data(),
				   (const float *)doutf.data(), (const float *)x.data(),
				   (const uint16_t *)w.data(), (const float *)rmean.data(),
				   (const float *)rrstd.data(), N, C);
			emu_colsum(db.data(), dw.data(), doutf.data(), x.data(), rmean.data(),
				   rrstd.data(), N, C);
			rows_colsum(odb.data(), odw.data(), doutf.data(), x.data(), rmean.data(),
				    rrstd.data(), N, C);
		} else {
			emu_launch(k_layernorm_bwd_dinp_b<uint16_t>, grid_warp_rows(N), ROW, dx.data(),
				   (const uint16_t *)doutb.data(), (const float *)x.data(),
				   (const uint16_t *)w.data(), (const float *)rmean.data(),
				   (const float *)rrstd.data(), N, C);
			emu_colsum(db.data(), dw.data(), doutb.data(), x.data(), rmean.data(),
				   rrstd.data(), N, C);
			rows_colsum(odb.data(), odw.data(), doutb.data(), x.data(), rmean.data(),
				    rrstd.data(), N, C);
		}
		cpu({ .kind = ST_OP_LAYERNORM_BWD,
		      .t = { TF(rdx), TF(rdw), TF(rdb), df ? TF(doutf) : TB(doutb), TF(x), TB(w),
			     TF(rmean), TF(rrstd) },
		      .i = { N, C } });
		close_f(df ? "layernorm_bwd fffffbff dinp" : "layernorm_bwd fffbfbff dinp", dx, rdx);
		close_f(df ? "layernorm_bwd fffffbff dweight" : "layernorm_bwd fffbfbff dweight", dw,
			rdw);
		close_f(df ? "layernorm_bwd fffffbff dbias" : "layernorm_bwd fffbfbff dbias", db, rdb);
		// against the one-thread-a-column sums they replace: the same
		// bits where the order is the same (a plain sum of at most
		// COL_LANES rows: one row a lane, the lanes in row order);
		// otherwise the order of the fp32 additions differs, so 1e-5 as
		// against the cpu
		if (N <= ST_CUDA_COL_LANES)
			same_bits(df ? "layernorm_bwd dbias = rows (fp32)" : "layernorm_bwd dbias = rows (bf16)",
				  db, odb);
		close_f(df ? "layernorm_bwd dweight ~ rows (fp32)" : "layernorm_bwd dweight ~ rows (bf16)",
			dw, odw);
		close_f(df ? "layernorm_bwd dbias ~ rows (fp32)" : "layernorm_bwd dbias ~ rows (bf16)", db,
			odb);
	}
}

static void check_gelu(size_t n)
{
	vb x = rb(n, 5.0f), dy = rb(n, 1.0f);
	vb y = nan_b(n), ry = nan_b(n), dx = nan_b(n), rdx = nan_b(n);

	emu_launch(k_gelu_fwd_b, grid_for(n, ST_CUDA_ELEM_BLOCK), ELEM, y.data(),
		   (const uint16_t *)x.data(), n);
	cpu({ .kind = ST_OP_GELU_FWD, .t = { TB(ry), TB(x) }, .i = { (int64_t)n } });
	close_b("gelu_fwd bb", y, ry);
	emu_launch(k_gelu_bwd_b, grid_for(n, ST_CUDA_ELEM_BLOCK), ELEM, dx.data(),
		   (const uint16_t *)x.data(), (const uint16_t *)dy.data(), n);
	cpu({ .kind = ST_OP_GELU_BWD, .t = { TB(rdx), TB(x), TB(dy) }, .i = { (int64_t)n } });
	close_b("gelu_bwd bbb", dx, rdx);
	// in place, as the model runs it (dinp = inp)
	vb xi = x, rxi = x;
	emu_launch(k_gelu_bwd_b, grid_for(n, ST_CUDA_ELEM_BLOCK), ELEM, xi.data(),
		   (const uint16_t *)xi.data(), (const uint16_t *)dy.data(), n);
	cpu({ .kind = ST_OP_GELU_BWD, .t = { TB(rxi), TB(rxi), TB(dy) }, .i = { (int64_t)n } });
	close_b("gelu_bwd bbb in place", xi, rxi);
}

static void check_embedding(int B, int T, int C, int V)
{
	std::vector<int32_t> tok((size_t)B * T);
	for (size_t i = 0; i < tok.size(); i++)
		tok[i] = (int32_t)((i * 7 + 3) % (size_t)V);
	vb wte = rb((size_t)V * C, 1.0f), wpe = rb((size_t)T * C, 1.0f);
	size_t n = (size_t)B * T * C;
	vf out = nan_f(n), rout = nan_f(n);

	emu_launch(k_embedding_fwd_b, grid_for(n, ST_CUDA_ELEM_BLOCK), ELEM, out.data(),
		   (const int32_t *)tok.data(), (const uint16_t *)wte.data(),
		   (const uint16_t *)wpe.data(), T, C, n);
	cpu({ .kind = ST_OP_EMBEDDING_FWD,
	      .t = { TF(rout), st_tensor_1d(tok.data(), ST_DTYPE_I32, (int64_t)tok.size()), TB(wte),
		     TB(wpe) },
	      .i = { B, T, C } });
	close_f("embedding_fwd fibb", out, rout);
}

// the dbias of the bf16 matmul backward, and the bias rows of its fallback
static void check_matmul_parts(int N, int IC, int OC)
{
	vb dout = rb((size_t)N * OC, 1.0f), inp = rb((size_t)N * IC, 1.0f), w = rb((size_t)IC * OC, 0.3f);
	vf db = rf(OC, 0.5f), rdb = db, odb = db;

	emu_colsum(db.data(), (float *)NULL, dout.data(), (const float *)NULL, (const float *)NULL,
		   (const float *)NULL, N, OC);
	rows_colsum(odb.data(), (float *)NULL, dout.data(), (const float *)NULL, (const float *)NULL,
		    (const float *)NULL, N, OC);
	cpu({ .kind = ST_OP_MATMUL_BWD,
	      .t = { st_tensor_1d(NULL, ST_DTYPE_BF16, (int64_t)N * IC),
		     st_tensor_1d(NULL, ST_DTYPE_F32, (int64_t)IC * OC), TF(rdb), TB(dout), TB(inp),
		     TB(w) },
	      .i = { N, IC, OC } });
	close_f("matmul_bwd bffbbb dbias (colsum)", db, rdb);
	if (N <= ST_CUDA_COL_LANES)
		same_bits("matmul_bwd dbias = rows", db, odb);
	close_f("matmul_bwd dbias ~ rows", db, odb);

	vb bias = rb(OC, 1.0f);
	vb rows = nan_b((size_t)N * OC), rrows((size_t)N * OC);
	vf rowsf = nan_f((size_t)N * OC), rrowsf((size_t)N * OC);
	emu_launch(k_fill_rows_b<uint16_t>, grid_for((size_t)N * OC, ST_CUDA_ELEM_BLOCK), ELEM,
		   rows.data(), (const uint16_t *)bias.data(), (size_t)N, OC);
	emu_launch(k_fill_rows_b<float>, grid_for((size_t)N * OC, ST_CUDA_ELEM_BLOCK), ELEM,
		   rowsf.data(), (const uint16_t *)bias.data(), (size_t)N, OC);
	for (int n = 0; n < N; n++)
		for (int o = 0; o < OC; o++) {
			rrows[(size_t)n * OC + o] = bias[o];
			rrowsf[(size_t)n * OC + o] = wid(bias[o]);
		}
	close_b("matmul_fwd bias rows (bf16)", rows, rrows);
	close_f("matmul_fwd bias rows (fp32)", rowsf, rrowsf);
}

// LLaMA's: ops_kernels.cuh's templated kernels at bf16 against the cpu
// compute's bf16 records, at the dtypes src/model/llama.c makes them at bf16
static void check_rmsnorm(int N, int C)
{
	const float eps = 1e-5f;
	vf x = rf((size_t)N * C, 2.0f), a = rf((size_t)N * C, 1.0f), b = rf((size_t)N * C, 1.0f);
	vb w = rb(C, 1.0f);
	vb out = nan_b((size_t)N * C), rout = nan_b((size_t)N * C);
	vf rstd = nan_f(N), rrstd = nan_f(N);

	emu_launch(k_rmsnorm_fwd<uint16_t, uint16_t>, grid_warp_rows(N), ROW, out.data(),
		   rstd.data(), (const float *)x.data(), (const uint16_t *)w.data(), eps, N, C);
	cpu({ .kind = ST_OP_RMSNORM_FWD, .t = { TB(rout), TF(rrstd), TF(x), TB(w) },
	      .i = { N, C }, .f = { eps } });
	close_b("rmsnorm_fwd bffb out", out, rout);
	close_f("rmsnorm_fwd bffb rstd", rstd, rrstd);

	vf res = nan_f((size_t)N * C), rres = nan_f((size_t)N * C);
	vb hout = nan_b((size_t)N * C), rhout = nan_b((size_t)N * C);
	vf hrstd = nan_f(N), rhrstd = nan_f(N);
	emu_launch(k_residual_rmsnorm_fwd<uint16_t, uint16_t>, grid_warp_rows(N), ROW, res.data(),
		   hout.data(), hrstd.data(), (const float *)a.data(), (const float *)b.data(),
		   (const uint16_t *)w.data(), eps, N, C);
	cpu({ .kind = ST_OP_RESIDUAL_RMSNORM_FWD,
	      .t = { TF(rres), TB(rhout), TF(rhrstd), TF(a), TF(b), TB(w) },
	      .i = { N, C }, .f = { eps } });
	close_f("residual_rmsnorm_fwd fbfffb res", res, rres);
	close_b("residual_rmsnorm_fwd fbfffb out", hout, rhout);
	close_f("residual_rmsnorm_fwd fbfffb rstd", hrstd, rhrstd);

	// backward, dout bf16 (a layer's) and fp32 (the head's): dinp, dweight accumulate
	for (int df = 0; df < 2; df++) {
		vb doutb = rb((size_t)N * C, 1.0f);
		vf doutf = rf((size_t)N * C, 1.0f);
		vf dx = rf((size_t)N * C, 0.5f), dw = rf(C, 0.5f);
		vf rdx = dx, rdw = dw, odw = dw;

		if (df) {
			emu_launch(k_rmsnorm_bwd_dinp<float, uint16_t>, grid_warp_rows(N), ROW,
				   dx.data(), (const float *)doutf.data(), (const float *)x.data(),
				   (const uint16_t *)w.data(), (const float *)rrstd.data(), N, C);
			emu_colsum((float *)NULL, dw.data(), doutf.data(), x.data(), (const float *)NULL,
				   rrstd.data(), N, C);
			rows_colsum((float *)NULL, odw.data(), doutf.data(), x.data(),
				    (const float *)NULL, rrstd.data(), N, C);
		} else {
			emu_launch(k_rmsnorm_bwd_dinp<uint16_t, uint16_t>, grid_warp_rows(N), ROW,
				   dx.data(), (const uint16_t *)doutb.data(), (const float *)x.data(),
				   (const uint16_t *)w.data(), (const float *)rrstd.data(), N, C);
			emu_colsum((float *)NULL, dw.data(), doutb.data(), x.data(), (const float *)NULL,
				   rrstd.data(), N, C);
			rows_colsum((float *)NULL, odw.data(), doutb.data(), x.data(),
				    (const float *)NULL, rrstd.data(), N, C);
		}
		cpu({ .kind = ST_OP_RMSNORM_BWD,
		      .t = { TF(rdx), TF(rdw), df ? TF(doutf) : TB(doutb), TF(x), TB(w), TF(rrstd) },
		      .i = { N, C } });
		close_f(df ? "rmsnorm_bwd ffffbf dinp" : "rmsnorm_bwd ffbfbf dinp", dx, rdx);
		close_f(df ? "rmsnorm_bwd ffffbf dweight" : "rmsnorm_bwd ffbfbf dweight", dw, rdw);
		close_f(df ? "rmsnorm_bwd dweight ~ rows (fp32)" : "rmsnorm_bwd dweight ~ rows (bf16)",
			dw, odw);
	}
}

// in place, as the model rotates q and k (and dq, dk back)
static void check_rope(int B, int T, int NH, int hd, int stride, int type, int orig,
		       float theta, float factor, float lo, float hi, int pos0)
{
	size_t n = (size_t)B * T * stride, pairs = (size_t)B * T * NH * (hd / 2);

	for (int bwd = 0; bwd < 2; bwd++) {
		vb x = rb(n, 1.0f), rx = x;
		emu_launch(k_rope<uint16_t>, grid_for(pairs, ST_CUDA_ELEM_BLOCK), ELEM, x.data(),
			   (const uint16_t *)x.data(), T, pos0, NH, hd, stride, pairs, type, orig, theta,
			   factor, lo, hi, bwd ? -1.0f : 1.0f);
		cpu({ .kind = bwd ? ST_OP_ROPE_BWD : ST_OP_ROPE_FWD, .t = { TB(rx), TB(rx) },
		      .i = { B, T, NH, hd, stride, type, orig, pos0 }, .f = { theta, factor, lo, hi } });
		close_b(bwd ? "rope_bwd bb in place" : "rope_fwd bb in place", x, rx);
	}
}

static void check_swiglu(size_t n)
{
	vb g = rb(n, 6.0f), u = rb(n, 2.0f), d = rb(n, 1.0f);
	vb y = nan_b(n), ry = nan_b(n);

	emu_launch(k_swiglu_fwd<uint16_t>, grid_for(n, ST_CUDA_ELEM_BLOCK), ELEM, y.data(),
		   (const uint16_t *)g.data(), (const uint16_t *)u.data(), n);
	cpu({ .kind = ST_OP_SWIGLU_FWD, .t = { TB(ry), TB(g), TB(u) }, .i = { (int64_t)n } });
	close_b("swiglu_fwd bbb", y, ry);
	// in place, as the model runs it (dgate = gate, dup = up)
	vb ig = g, iu = u, rig = g, riu = u;
	emu_launch(k_swiglu_bwd<uint16_t>, grid_for(n, ST_CUDA_ELEM_BLOCK), ELEM, ig.data(),
		   iu.data(), (const uint16_t *)d.data(), (const uint16_t *)ig.data(),
		   (const uint16_t *)iu.data(), n);
	cpu({ .kind = ST_OP_SWIGLU_BWD, .t = { TB(rig), TB(riu), TB(d), TB(rig), TB(riu) },
	      .i = { (int64_t)n } });
	close_b("swiglu_bwd bbbbb in place dgate", ig, rig);
	close_b("swiglu_bwd bbbbb in place dup", iu, riu);
}

static void check_token_embed(int N, int C, int V)
{
	std::vector<int32_t> tok(N);
	for (int i = 0; i < N; i++)
		tok[i] = (int32_t)((i * 11 + 5) % V);
	vb wte = rb((size_t)V * C, 1.0f);
	vf out = nan_f((size_t)N * C), rout = nan_f((size_t)N * C);

	emu_launch(k_token_embed_fwd<uint16_t>, grid_for((size_t)N * C, ST_CUDA_ELEM_BLOCK), ELEM,
		   out.data(), (const int32_t *)tok.data(), (const uint16_t *)wte.data(), C,
		   (size_t)N * C);
	cpu({ .kind = ST_OP_TOKEN_EMBED_FWD,
	      .t = { TF(rout), st_tensor_1d(tok.data(), ST_DTYPE_I32, N),
		     st_tensor_2d(wte.data(), ST_DTYPE_BF16, V, C) },
	      .i = { N, C } });
	close_f("token_embed_fwd fib", out, rout);
}

int main(void)
{
	check_layernorm(37, 96);
	check_layernorm(5, 33); /* a row shorter than two warps' worth, odd */
	check_layernorm(300, 40); /* two row chunks of the column sums */
	check_gelu(10007);
	check_embedding(2, 19, 40, 53);
	check_matmul_parts(300, 24, 72);
	check_matmul_parts(7, 24, 72); /* the rows' order: the same bits */
	check_rmsnorm(37, 96);
	check_rmsnorm(5, 33);
	check_rope(2, 19, 3, 16, 56, 0, 0, 10000.0f, 1.0f, 1.0f, 1.0f, 0);
	check_rope(2, 23, 2, 24, 48, 2, 16, 500000.0f, 8.0f, 1.0f, 4.0f, 0); /* llama3 scaling */
	check_rope(1, 5, 2, 24, 48, 2, 16, 500000.0f, 8.0f, 1.0f, 4.0f, 37); /* the decoder's */
	check_swiglu(10007);
	check_token_embed(38, 40, 53);
	if (emu_launch_errors)
		fails++;
	if (fails)
		fprintf(stderr, "%d check(s) failed\n", fails);
	return fails ? 1 : 0;
}
