/* The bf16 tensor-core attention on a real GPU (src/backend/kernels/cuda/
 * attention_bf16.cu), through the cuda compute's op seam (bf16 dtypes on
 * ATTENTION_FWD/BWD and GQA_ATTENTION_FWD/BWD), against the cpu compute
 * running the same records (kernels_bf16.h: the fp32 kernels on the
 * bf16 values, bf16 outputs rounded once).
 *
 * The compute must claim the bf16 signatures (fp32 or bf16 gradients) and
 * refuse mixed ones. Per shape (GPT-2's block B=2 T=256 C=768 NH=12, hs 128
 * with a partial tile, a single token, GQA 8/2 at hs 64, MQA at hs 128):
 * out within 1e-2 relative, lse within 1e-4; the backward from the cpu's
 * out and lse, gradients starting from random values: what is
 * added within 1e-2 into fp32 gradients, the sums within 1e-2 into bf16
 * ones; outputs poisoned (0xff bytes) before each run; a second run of
 * each gives the same bits (deterministic: no atomics). The same kernels
 * run under the cpu emulation on every machine (attention-bf16-emu).
 *
 * ST_TEST_SMALL=1 (tools/gpu-check's sanitize step, under compute-
 * sanitizer, where every access is checked) shrinks the shapes to a few
 * tiles each, still covering a partial tile of queries and of keys (70
 * rows: 64 + 6), hs 64 and 128, a single token, GQA and MQA.
 *
 * Without a GPU or driver: "no GPU: skipped", exit 77. */
#include "gpu_harness.h"
#include "strata/op.h"

/* n random values in [-a, a) rounded to bf16: bits in h, values in f. */
static void brand(size_t n, float a, uint16_t **h, float **f)
{
	*h = xmalloc(2 * n);
	*f = xmalloc(4 * n);
	for (size_t i = 0; i < n; i++) {
		(*h)[i] = st_cpu_bf16_from_f32(rng_uniform(a));
		(*f)[i] = st_cpu_f32_from_bf16((*h)[i]);
	}
}

static struct st_tensor t1(const void *p, enum st_dtype dt, size_t n)
{
	return st_tensor_1d(p, dt, (int64_t)n);
}

/* The attention record of one shape: the forward (fwd) or the backward,
 * gradients of dtype G, over tensors p[] in the op's slot order. */
static struct st_op att_op(bool gqa, bool fwd, enum st_dtype G, void *const *p, int B, int T,
			   int NH, int NKV, int hs)
{
	const enum st_dtype BF = ST_DTYPE_BF16, F = ST_DTYPE_F32;
	const size_t nq = (size_t)B * T * NH * hs, nk = (size_t)B * T * NKV * hs;
	const size_t nl = (size_t)B * NH * T;
	struct st_op op = { 0 };

	if (gqa && fwd) {
		op.kind = ST_OP_GQA_ATTENTION_FWD;
		op.t[0] = t1(p[0], BF, nq);
		op.t[1] = t1(p[1], F, nl);
		op.t[2] = t1(p[2], BF, nq);
		op.t[3] = t1(p[3], BF, nk);
		op.t[4] = t1(p[4], BF, nk);
		op.t[5] = t1(NULL, ST_DTYPE_I32, (size_t)B * T);
	} else if (gqa) {
		op.kind = ST_OP_GQA_ATTENTION_BWD;
		op.t[0] = t1(p[0], G, nq);
		op.t[1] = t1(p[1], G, nk);
		op.t[2] = t1(p[2], G, nk);
		op.t[3] = t1(p[3], BF, nq);
		op.t[4] = t1(p[4], BF, nq);
		op.t[5] = t1(p[5], BF, nk);
		op.t[6] = t1(p[6], BF, nk);
		op.t[7] = t1(p[7], BF, nq);
		op.t[8] = t1(p[8], F, nl);
		op.t[9] = t1(NULL, ST_DTYPE_I32, (size_t)B * T);
	} else if (fwd) {
		op.kind = ST_OP_ATTENTION_FWD;
		op.t[0] = t1(p[0], BF, nq);
		op.t[1] = t1(p[1], F, nl);
		op.t[2] = t1(p[2], BF, 3 * nq);
		op.t[3] = t1(NULL, ST_DTYPE_I32, (size_t)B * T);
	} else {
		op.kind = ST_OP_ATTENTION_BWD;
		op.t[0] = t1(p[0], G, 3 * nq);
		op.t[1] = t1(p[1], BF, nq);
		op.t[2] = t1(p[2], BF, 3 * nq);
		op.t[3] = t1(p[3], BF, nq);
		op.t[4] = t1(p[4], F, nl);
		op.t[5] = t1(NULL, ST_DTYPE_I32, (size_t)B * T);
	}
	if (gqa) {
		op.i[0] = B, op.i[1] = T, op.i[2] = NH, op.i[3] = NKV, op.i[4] = hs;
	} else {
		op.i[0] = B, op.i[1] = T, op.i[2] = (int64_t)NH * hs, op.i[3] = NH;
	}
	return op;
}

/* Run op on the cpu compute (the reference: kernels_bf16.h, fp32
 * math on the bf16 values, bf16 outputs rounded once). */
static void cpu_run(const struct st_op *op)
{
	struct st_compute *cpu = st_compute_cpu();

	if (!st_compute_supports_op(cpu, op))
		die("the cpu compute refuses the bf16 attention record", -ENOTSUP);
	st_compute_run(cpu, op);
	int rc = st_compute_sync(cpu);
	if (rc)
		die("the cpu compute's run", rc);
}

static float *widen(const uint16_t *h, size_t n)
{
	float *f = malloc(4 * (n ? n : 1));

	if (!f)
		die("malloc", -ENOMEM);
	for (size_t i = 0; i < n; i++)
		f[i] = st_cpu_f32_from_bf16(h[i]);
	return f;
}

/* One shape: MHA (qkv interleaved, NKV == NH, gqa false) or GQA. The same
 * records run on the cuda compute (device pointers) and on the cpu compute
 * (host pointers, the reference). */
static void check(int B, int T, int NH, int NKV, int hs, bool gqa)
{
	const int C = NH * hs;
	const size_t nq = (size_t)B * T * C, nk = (size_t)B * T * NKV * hs;
	const size_t nl = (size_t)B * NH * T;
	const size_t nin = gqa ? nq : 3 * nq; /* q (or qkv) */
	char shape[80];

	if (gqa)
		snprintf(shape, sizeof(shape), "gqa (%d,%d,%d/%d,%d)", B, T, NH, NKV, hs);
	else
		snprintf(shape, sizeof(shape), "mha (%d,%d,%d,%d)", B, T, C, NH);

	uint16_t *hq, *hk = NULL, *hv = NULL, *hg;
	float *fq, *fk = NULL, *fv = NULL, *fg;
	brand(nin, 2.0f, &hq, &fq);
	if (gqa) {
		brand(nk, 2.0f, &hk, &fk);
		brand(nk, 2.0f, &hv, &fv);
	}
	brand(nq, 1.0f, &hg, &fg);

	/* the reference forward */
	uint16_t *hout = malloc(2 * nq);
	float *lse = malloc(4 * nl);
	if (!hout || !lse)
		die("malloc", -ENOMEM);
	{
		void *hp[5] = { hout, lse, hq, hk, hv };
		const struct st_op op = att_op(gqa, true, ST_DTYPE_F32, hp, B, T, NH, NKV, hs);
		cpu_run(&op);
	}
	float *out = widen(hout, nq);

	void *dq_in = dev_from(hq, 2 * nin), *dk_in = gqa ? dev_from(hk, 2 * nk) : NULL;
	void *dv_in = gqa ? dev_from(hv, 2 * nk) : NULL, *d_g = dev_from(hg, 2 * nq);
	float *run1 = NULL, *run1l = NULL;
	for (int rep = 0; rep < 2; rep++) {
		void *d_out = dev_poison(2 * nq), *d_lse = dev_poison(4 * nl);
		void *dp[5] = { d_out, d_lse, dq_in, dk_in, dv_in };
		const struct st_op op = att_op(gqa, true, ST_DTYPE_F32, dp, B, T, NH, NKV, hs);
		st_compute_run(cx, &op);
		float *o = back(d_out, nq, true), *l = back(d_lse, nl, false);
		if (rep == 0) {
			expect(shape, "out", o, out, NULL, nq, 1e-2);
			expect(shape, "lse", l, lse, NULL, nl, 1e-4);
			run1 = o;
			run1l = l;
		} else {
			expect_same(shape, "fwd out", run1, o, nq);
			expect_same(shape, "fwd lse", run1l, l, nl);
			free(o);
			free(l);
		}
		st_cuda_free(d_out);
		st_cuda_free(d_lse);
	}
	free(run1);
	free(run1l);

	/* the backward from the reference's out and lse, both sides */
	void *d_o = dev_from(hout, 2 * nq), *d_l = dev_from(lse, 4 * nl);
	const size_t ngrad[3] = { nin, gqa ? nk : 0, gqa ? nk : 0 };
	uint16_t *h0[3];
	float *f0[3];
	for (int k = 0; k < 3; k++)
		brand(ngrad[k], 1.0f, &h0[k], &f0[k]);
	static const char *names[2][3] = { { "dqkv", "", "" }, { "dq", "dk", "dv" } };
	for (int bf = 0; bf < 2; bf++) {
		const enum st_dtype G = bf ? ST_DTYPE_BF16 : ST_DTYPE_F32;
		const size_t esz = bf ? 2 : 4;
		/* the reference: gradients from the same start on the cpu */
		void *hgrad[3] = { NULL, NULL, NULL };
		float *ref[3] = { NULL, NULL, NULL };
		for (int k = 0; k < 3; k++) {
			if (!ngrad[k])
				continue;
			if (!(hgrad[k] = malloc(esz * ngrad[k])))
				die("malloc", -ENOMEM);
			memcpy(hgrad[k], bf ? (void *)h0[k] : (void *)f0[k], esz * ngrad[k]);
		}
		{
			void *hp[9];
			if (gqa) {
				void *t[9] = { hgrad[0], hgrad[1], hgrad[2], hg, hq, hk, hv, hout, lse };
				memcpy(hp, t, sizeof(t));
			} else {
				void *t[5] = { hgrad[0], hg, hq, hout, lse };
				memcpy(hp, t, sizeof(t));
			}
			const struct st_op op = att_op(gqa, false, G, hp, B, T, NH, NKV, hs);
			cpu_run(&op);
		}
		for (int k = 0; k < 3; k++)
			if (ngrad[k]) {
				if (bf) {
					ref[k] = widen(hgrad[k], ngrad[k]);
				} else {
					ref[k] = malloc(4 * ngrad[k]);
					if (!ref[k])
						die("malloc", -ENOMEM);
					memcpy(ref[k], hgrad[k], 4 * ngrad[k]);
				}
			}
		float *first[3] = { NULL, NULL, NULL };
		for (int rep = 0; rep < 2; rep++) {
			void *dgrad[3] = { NULL, NULL, NULL };
			for (int k = 0; k < 3; k++)
				if (ngrad[k])
					dgrad[k] = bf ? dev_from(h0[k], 2 * ngrad[k])
						      : dev_from(f0[k], 4 * ngrad[k]);
			void *dp[9];
			if (gqa) {
				void *t[9] = { dgrad[0], dgrad[1], dgrad[2], d_g, dq_in,
					       dk_in,    dv_in,    d_o,      d_l };
				memcpy(dp, t, sizeof(t));
			} else {
				void *t[5] = { dgrad[0], d_g, dq_in, d_o, d_l };
				memcpy(dp, t, sizeof(t));
			}
			const struct st_op op = att_op(gqa, false, G, dp, B, T, NH, NKV, hs);
			st_compute_run(cx, &op);
			for (int k = 0; k < 3; k++) {
				if (!ngrad[k])
					continue;
				float *got = back(dgrad[k], ngrad[k], bf);
				char what[48];
				snprintf(what, sizeof(what), "%s (%s)", names[gqa][k],
					 bf ? "bf16 sum" : "fp32, added");
				if (rep == 0) {
					/* fp32: what is added; bf16: the sums */
					expect(shape, what, got, ref[k], bf ? NULL : f0[k],
					       ngrad[k], 1e-2);
					first[k] = got;
				} else {
					expect_same(shape, what, first[k], got, ngrad[k]);
					free(got);
					free(first[k]);
				}
				st_cuda_free(dgrad[k]);
			}
		}
		for (int k = 0; k < 3; k++) {
			free(hgrad[k]);
			free(ref[k]);
		}
	}
	for (int k = 0; k < 3; k++) {
		free(h0[k]);
		free(f0[k]);
	}
	st_cuda_free(d_o);
	st_cuda_free(d_l);
	st_cuda_free(dq_in);
	st_cuda_free(dk_in);
	st_cuda_free(dv_in);
	st_cuda_free(d_g);
	free(hq), free(fq), free(hk), free(fk), free(hv), free(fv), free(hg), free(fg);
	free(out), free(lse), free(hout);
}

/* The compute claims the bf16 signatures and refuses mixed ones. */
static void check_supports(void)
{
	const enum st_dtype F = ST_DTYPE_F32, BF = ST_DTYPE_BF16, I = ST_DTYPE_I32;
	static const struct {
		enum st_op_kind kind;
		enum st_dtype dt[10];
		bool want;
	} rows[] = {
		{ ST_OP_ATTENTION_FWD, { BF, F, BF, I }, true },
		{ ST_OP_ATTENTION_FWD, { F, F, BF, I }, false },
		{ ST_OP_ATTENTION_FWD, { BF, BF, BF, I }, false },
		{ ST_OP_ATTENTION_BWD, { F, BF, BF, BF, F, I }, true },
		{ ST_OP_ATTENTION_BWD, { BF, BF, BF, BF, F, I }, true },
		{ ST_OP_ATTENTION_BWD, { F, F, BF, BF, F, I }, false },
		{ ST_OP_GQA_ATTENTION_FWD, { BF, F, BF, BF, BF, I }, true },
		{ ST_OP_GQA_ATTENTION_FWD, { BF, F, BF, F, BF, I }, false },
		{ ST_OP_GQA_ATTENTION_BWD, { F, F, F, BF, BF, BF, BF, BF, F, I }, true },
		{ ST_OP_GQA_ATTENTION_BWD, { BF, BF, BF, BF, BF, BF, BF, BF, F, I }, true },
		{ ST_OP_GQA_ATTENTION_BWD, { BF, F, BF, BF, BF, BF, BF, BF, F, I }, false },
	};
	const int fails0 = fails;

	for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
		if (st_compute_supports(cx, rows[r].kind, rows[r].dt) != rows[r].want) {
			fprintf(stderr, "FAIL supports: %s row %zu: %s\n", st_op_name(rows[r].kind),
				r, rows[r].want ? "refused" : "claimed");
			fails++;
		}
	}
	/* the head size too: 64 and 128 run, 24 is refused before the run */
	static const int hss[] = { 24, 64, 128 };
	void *const none[9] = { 0 };
	for (int g = 0; g < 2; g++)
		for (int f = 0; f < 2; f++)
			for (size_t h = 0; h < sizeof(hss) / sizeof(hss[0]); h++) {
				struct st_op op = att_op(g, f, ST_DTYPE_F32, none, 1, 8, 2,
							 g ? 1 : 2, hss[h]);

				if (st_compute_supports_op(cx, &op) != (hss[h] != 24)) {
					fprintf(stderr, "FAIL supports: %s at head size %d: %s\n",
						st_op_name(op.kind), hss[h],
						hss[h] == 24 ? "claimed" : "refused");
					fails++;
				}
			}
	if (fails == fails0)
		printf("ok   supports: the bf16 attention signatures, head sizes 64 and 128 only\n");
}

int main(int argc, char **argv)
{
	if (argc > 1) {
		printf("usage: %s\n(no options: the bf16 attention on the GPU against the cpu's; "
		       "exit 77 without a GPU; ST_TEST_SMALL=1: small shapes)\n",
		       argv[0]);
		return strcmp(argv[1], "--help") == 0 ? 0 : 2;
	}
	const char *small = getenv("ST_TEST_SMALL");

	gpu_open();
	check_supports();
	if (small && strcmp(small, "0") != 0) {
		printf("small shapes (ST_TEST_SMALL)\n");
		check(1, 70, 2, 2, 64, false);
		check(1, 70, 1, 1, 128, false);
		check(1, 1, 2, 2, 64, false);
		check(1, 70, 4, 2, 64, true);
		check(1, 33, 2, 1, 128, true);
	} else {
		check(2, 256, 12, 12, 64, false); /* a GPT-2 block */
		check(1, 100, 2, 2, 128, false);
		check(1, 1, 2, 2, 64, false);
		check(2, 130, 8, 2, 64, true);
		check(1, 200, 4, 1, 128, true);
	}
	int rc = st_compute_sync(cx);
	if (rc)
		die("sync", rc);
	st_compute_destroy(cx);
	printf("%s\n", fails ? "FAILED" : "all ok");
	return fails ? 1 : 0;
}
