// The bf16 head fused with the cross-entropy (src/backend/kernels/cuda/
// head_ce_kernels.cuh, the very code nvcc compiles, MMA emulated by
// mma_bf16.cuh under tests/cuda/cuda_emu.h) against the cpu compute's
// HEAD_CROSSENTROPY op (the unfused chunk loop the model ran before:
// GEMM, cross-entropy, bf16 dlogits, two GEMMs) on the same bf16 inputs.
//
// Shapes where every tile is partial somewhere: rows past the 64-row tile,
// C past the 64-column chunk and the 128-column backward tile, an odd C
// (read a bf16 at a time), V past the 64-entry vocab tile, vocabulary
// splits of the forward that are empty, a single row. Losses within 1e-6
// relative; what the backward ADDS to dx and dW (both start from random
// values) within 1e-4 relative (the logits are summed in a different
// order, so a few dlogits round to the neighbouring bf16). One shape runs
// twice: the same bits. Shared memory is poisoned before each block and
// checked for writes past each launch's size.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

extern "C" {
#include "compute_internal.h"
#include "strata/kernels.h"
}

#define EMU_SMEM_FLOATS (1 << 14) /* 64 KiB: the backward takes 37 KiB */
#include "cuda_emu.h"

#include "head_ce_kernels.cuh"

struct shape {
	const char *name;
	int N, C, V, S; /* S: the forward's vocabulary splits */
};

struct result {
	std::vector<float> losses, dx, dw;
};

static void bf16_fill(std::vector<uint16_t> &h, size_t n, float a, emu_rng &r)
{
	h.resize(n);
	for (size_t i = 0; i < n; i++)
		h[i] = st_cpu_bf16_from_f32(r.uniform(a));
}

// The kernels' launch sequence, as head_ce_bf16.cu's.
static result run_emu(const shape &s, const std::vector<uint16_t> &x,
		      const std::vector<uint16_t> &w, const std::vector<int32_t> &tgt,
		      const std::vector<float> &dx0, const std::vector<float> &dw0, float dloss)
{
	result out;
	std::vector<float> lse(s.N), part((size_t)3 * s.S * s.N);
	out.losses.assign(s.N, NAN);
	out.dx = dx0;
	out.dw = dw0;
	hc_params p = {};
	p.x = x.data();
	p.w = w.data();
	p.targets = tgt.data();
	p.losses = out.losses.data();
	p.lse = lse.data();
	p.part = part.data();
	p.dx = out.dx.data();
	p.dw = out.dw.data();
	p.dloss = dloss;
	p.N = s.N;
	p.C = s.C;
	p.V = s.V;
	p.S = s.S;
	const unsigned rt = (unsigned)((s.N + HC_TILE - 1) / HC_TILE),
		       vt = (unsigned)((s.V + HC_TILE - 1) / HC_TILE),
		       ct = (unsigned)((s.C + HC_DC - 1) / HC_DC);
	emu_launch_smem(hc_fwd_kernel, dim3(rt, (unsigned)s.S), dim3(HC_THREADS), hc_fwd_smem_bytes(),
			p);
	emu_launch(hc_lse_kernel, dim3((unsigned)((s.N + 127) / 128)), dim3(128), p);
	emu_launch_smem(hc_dx_kernel, dim3(rt, ct), dim3(HC_THREADS), hc_bwd_smem_bytes(), p);
	emu_launch_smem(hc_dw_kernel, dim3(vt, ct), dim3(HC_THREADS), hc_bwd_smem_bytes(), p);
	return out;
}

// The cpu compute's op, 16 rows a chunk.
static result run_cpu(const shape &s, const std::vector<uint16_t> &x,
		      const std::vector<uint16_t> &w, const std::vector<int32_t> &tgt,
		      const std::vector<float> &dx0, const std::vector<float> &dw0, float dloss)
{
	const int R = 16;
	result out;
	std::vector<float> logits((size_t)R * s.V);
	std::vector<uint16_t> dlog((size_t)R * s.V);
	out.losses.assign(s.N, NAN);
	out.dx = dx0;
	out.dw = dw0;
	struct st_op op = {};
	op.kind = ST_OP_HEAD_CROSSENTROPY;
	op.t[0] = st_tensor_1d(out.losses.data(), ST_DTYPE_F32, s.N);
	op.t[1] = st_tensor_2d(out.dx.data(), ST_DTYPE_F32, s.N, s.C);
	op.t[2] = st_tensor_2d(out.dw.data(), ST_DTYPE_F32, s.V, s.C);
	op.t[3] = st_tensor_2d(x.data(), ST_DTYPE_BF16, s.N, s.C);
	op.t[4] = st_tensor_2d(w.data(), ST_DTYPE_BF16, s.V, s.C);
	op.t[5] = st_tensor_1d(tgt.data(), ST_DTYPE_I32, s.N);
	op.t[6] = st_tensor_2d(logits.data(), ST_DTYPE_F32, R, s.V);
	op.t[7] = st_tensor_2d(dlog.data(), ST_DTYPE_BF16, R, s.V);
	op.i[0] = s.N;
	op.i[1] = s.C;
	op.i[2] = s.V;
	op.i[3] = R;
	op.f[0] = dloss;
	st_cpu_op_run(&op);
	return out;
}

static int expect(const shape &s, const char *what, const std::vector<float> &got,
		  const std::vector<float> &ref, double tol)
{
	char label[128];
	snprintf(label, sizeof(label), "%s %s", s.name, what);
	return emu_expect_close(label, got, ref, tol);
}

/* Rows whose target is -1 (masked out) have loss 0 and add nothing to dx. */
static int expect_ignored(const shape &s, const char *who, const result &res,
			  const std::vector<int32_t> &tgt, const std::vector<float> &dx0)
{
	int bad = 0;
	for (int i = 0; i < s.N; i++) {
		if (tgt[i] >= 0)
			continue;
		bad += res.losses[i] != 0.0f;
		for (int c = 0; c < s.C; c++)
			bad += res.dx[(size_t)i * s.C + c] != dx0[(size_t)i * s.C + c];
	}
	if (bad) {
		fprintf(stderr, "FAIL %s %s: %d values of ignored rows (target -1) not 0\n", s.name,
			who, bad);
		return 1;
	}
	if (!getenv("ST_QUIET"))
		printf("ok   %s %s: ignored rows add nothing\n", s.name, who);
	return 0;
}

static int check(const shape &s, uint64_t seed, bool twice, bool masked)
{
	emu_rng r(seed);
	std::vector<uint16_t> x, w;
	std::vector<int32_t> tgt(s.N);
	std::vector<float> dx0((size_t)s.N * s.C), dw0((size_t)s.V * s.C);
	/* logits of a few units: a softmax neither flat nor one-hot */
	const float xa = 1.0f, wa = 4.0f / sqrtf((float)s.C);
	bf16_fill(x, (size_t)s.N * s.C, xa, r);
	bf16_fill(w, (size_t)s.V * s.C, wa, r);
	for (int i = 0; i < s.N; i++)
		tgt[i] = r.below(s.V);
	for (int i = 0; masked && i < s.N; i += 3) /* a loss mask: every third row out */
		tgt[i] = -1;
	for (auto &v : dx0)
		v = r.uniform(1.0f);
	for (auto &v : dw0)
		v = r.uniform(1.0f);
	const float dloss = 1.0f / (float)s.N;

	const result ref = run_cpu(s, x, w, tgt, dx0, dw0, dloss);
	const result got = run_emu(s, x, w, tgt, dx0, dw0, dloss);
	int fails = 0;
	fails += expect(s, "loss", got.losses, ref.losses, 1e-6);
	fails += expect(s, "dx added", emu_minus(got.dx, dx0), emu_minus(ref.dx, dx0), 1e-4);
	fails += expect(s, "dW added", emu_minus(got.dw, dw0), emu_minus(ref.dw, dw0), 1e-4);
	if (masked) {
		fails += expect_ignored(s, "cpu", ref, tgt, dx0);
		fails += expect_ignored(s, "emulated", got, tgt, dx0);
	}
	if (twice) {
		const result again = run_emu(s, x, w, tgt, dx0, dw0, dloss);
		const bool same =
			memcmp(again.losses.data(), got.losses.data(), 4 * got.losses.size()) == 0 &&
			memcmp(again.dx.data(), got.dx.data(), 4 * got.dx.size()) == 0 &&
			memcmp(again.dw.data(), got.dw.data(), 4 * got.dw.size()) == 0;
		if (!same) {
			fprintf(stderr, "FAIL %s: a second run gave other bits\n", s.name);
			fails++;
		} else if (!getenv("ST_QUIET")) {
			printf("ok   %-34s\n", "  rerun: the same bits");
		}
	}
	return fails;
}

int main(int argc, char **argv)
{
	if (argc > 1) {
		printf("usage: %s\n  the fused head's kernels under the cpu emulation against "
		       "the cpu op; exit 1 on a mismatch\n",
		       argv[0]);
		return strcmp(argv[1], "--help") == 0 ? 0 : 2;
	}
	const shape shapes[] = {
		/* every tile partial: rows 70 (64 + 6), C 136 (64 + 64 + 8; 128 + 8),
		 * V 200 (3 x 64 + 8), two vocabulary splits */
		{ "N=70 C=136 V=200 S=2", 70, 136, 200, 2 },
		/* odd C, one split */
		{ "N=33 C=37 V=77 S=1", 33, 37, 77, 1 },
		/* five vocab tiles in four splits: the last split empty */
		{ "N=20 C=64 V=300 S=4", 20, 64, 300, 4 },
		/* a single row */
		{ "N=1 C=64 V=70 S=2", 1, 64, 70, 2 },
	};
	int fails = 0;
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
		fails += check(shapes[i], i + 1, i == 0, false);
	/* with ignored targets (-1, a loss mask) */
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
		fails += check(shapes[i], i + 11, false, true);
	if (emu_smem_overruns || emu_launch_errors) {
		fprintf(stderr, "FAIL shared memory: %d launches wrote past their size or could "
				"not run (%d)\n",
			emu_smem_overruns, emu_launch_errors);
		fails++;
	}
	if (fails)
		fprintf(stderr, "%d check(s) failed\n", fails);
	return fails ? 1 : 0;
}
