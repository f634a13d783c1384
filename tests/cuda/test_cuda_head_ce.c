/* The bf16 head fused with the cross-entropy on a real GPU (src/backend/
 * cuda/head_ce_bf16.cu), through the cuda compute's op seam
 * (HEAD_CROSSENTROPY), against the cpu compute running the same record
 * (the unfused chunk loop: GEMM, cross-entropy, bf16 dlogits, two GEMMs).
 *
 * The cuda compute must claim the op's signature and refuse others (the
 * model then keeps its unfused path). Per shape (GPT-2's head at 512 rows:
 * C=768, V=50257; every tile partial: 70 x 136, V=200; an odd C: 33 x 37,
 * V=77; a single row): losses within 1e-5 relative, what is added to dx
 * and dW (both start from random values) within 1e-3; losses poisoned
 * (0xff bytes) before each run; the forward alone gives the backward
 * call's losses bit for bit; a second run gives the same bits (no
 * atomics). The same kernels run under the cpu emulation on every machine
 * (head-ce-emu).
 *
 * --bench [--json FILE]: then the fused op against the unfused records on
 * the same GPU (cuBLASLt GEMMs and the cross-entropy kernels, 256 rows a
 * chunk, as the model ran the head before), at gpt2's B=8 T=1024 (8192
 * rows, C=768, V=50257): the backward call (loss, dx, dW) and the forward
 * alone, the variants interleaved round by round, GPU time by the
 * compute's spans, medians of 10 (tools/gpu-check's head_ce step).
 *
 * ST_TEST_SMALL=1 (tools/gpu-check's sanitize step, under compute-
 * sanitizer) leaves out GPT-2's head and checks 130 x 264, V=333 instead:
 * every tile partial on each side (rows, vocabulary, C's columns in the
 * logits' chunks and in the backward's blocks), beside the small shapes.
 *
 * Without a GPU or driver: "no GPU: skipped", exit 77. */
#include "../../tools/bench_stats.h"
#include "gpu_harness.h"
#include "strata/op.h"

/* The op's record over p[]: losses, dx, dw, x, w, targets, logits and
 * dlogits scratch (R rows each); dx and dw NULL for the forward alone. */
static struct st_op head_op(void *const *p, int N, int C, int V, int R, float dloss)
{
	const enum st_dtype F = ST_DTYPE_F32, BF = ST_DTYPE_BF16;
	struct st_op op = { .kind = ST_OP_HEAD_CROSSENTROPY,
			    .t = { st_tensor_1d(p[0], F, N), st_tensor_2d(p[1], F, N, C),
				   st_tensor_2d(p[2], F, V, C), st_tensor_2d(p[3], BF, N, C),
				   st_tensor_2d(p[4], BF, V, C),
				   st_tensor_1d(p[5], ST_DTYPE_I32, N),
				   st_tensor_2d(p[6], F, R, V), st_tensor_2d(p[7], BF, R, V) },
			    .i = { N, C, V, R },
			    .f = { dloss } };
	return op;
}

struct data {
	int N, C, V, R;
	uint16_t *x, *w;
	int32_t *tgt;
	float *dx0, *dw0;
	void *d[8]; /* device buffers in slot order */
};

static void data_make(struct data *s, int N, int C, int V, int R)
{
	const size_t nx = (size_t)N * C, nw = (size_t)V * C, nr = (size_t)R * V;
	const float wa = 4.0f / sqrtf((float)C);

	*s = (struct data){ .N = N, .C = C, .V = V, .R = R };
	s->x = xmalloc(2 * nx);
	s->w = xmalloc(2 * nw);
	s->tgt = xmalloc(4 * (size_t)N);
	s->dx0 = xmalloc(4 * nx);
	s->dw0 = xmalloc(4 * nw);
	for (size_t i = 0; i < nx; i++)
		s->x[i] = st_cpu_bf16_from_f32(rng_uniform(1.0f));
	for (size_t i = 0; i < nw; i++)
		s->w[i] = st_cpu_bf16_from_f32(rng_uniform(wa));
	for (int i = 0; i < N; i++)
		s->tgt[i] = (int32_t)((rng_uniform(0.5f) + 0.5f) * (float)V) % V;
	for (size_t i = 0; i < nx; i++)
		s->dx0[i] = rng_uniform(1.0f);
	for (size_t i = 0; i < nw; i++)
		s->dw0[i] = rng_uniform(1.0f);
	s->d[0] = dev_from(NULL, 4 * (size_t)N);
	s->d[1] = dev_from(s->dx0, 4 * nx);
	s->d[2] = dev_from(s->dw0, 4 * nw);
	s->d[3] = dev_from(s->x, 2 * nx);
	s->d[4] = dev_from(s->w, 2 * nw);
	s->d[5] = dev_from(s->tgt, 4 * (size_t)N);
	s->d[6] = dev_from(NULL, 4 * nr);
	s->d[7] = dev_from(NULL, 2 * nr);
}

static void data_free(struct data *s)
{
	for (int k = 0; k < 8; k++)
		st_cuda_free(s->d[k]);
	free(s->x);
	free(s->w);
	free(s->tgt);
	free(s->dx0);
	free(s->dw0);
}

/* The op on the GPU from dx0, dw0 (gradients) or alone (forward); losses
 * poisoned first. Returns losses, and dx, dw when bwd. */
static void gpu_run(struct data *s, bool bwd, float dloss, float **losses, float **dx,
		    float **dw)
{
	const size_t nx = (size_t)s->N * s->C, nw = (size_t)s->V * s->C;
	void *p[8];
	int rc;

	memcpy(p, s->d, sizeof(p));
	if ((rc = st_cuda_memset(s->d[0], 0xff, 4 * (size_t)s->N)) ||
	    (rc = st_cuda_h2d(s->d[1], s->dx0, 4 * nx)) || (rc = st_cuda_h2d(s->d[2], s->dw0, 4 * nw)))
		die("the GPU's inputs", rc);
	if (!bwd)
		p[1] = p[2] = NULL;
	struct st_op op = head_op(p, s->N, s->C, s->V, s->R, dloss);
	st_compute_run(cx, &op);
	*losses = back(s->d[0], (size_t)s->N, false);
	if (bwd) {
		*dx = back(s->d[1], nx, false);
		*dw = back(s->d[2], nw, false);
	}
}

static void check(int N, int C, int V, int R)
{
	const size_t nx = (size_t)N * C, nw = (size_t)V * C, nr = (size_t)R * V;
	const float dloss = 1.0f / (float)N;
	char shape[96];
	struct data s;

	snprintf(shape, sizeof(shape), "N=%d C=%d V=%d", N, C, V);
	data_make(&s, N, C, V, R);

	/* the reference: the cpu compute on host copies */
	float *rl = xmalloc(4 * (size_t)N), *rdx = xmalloc(4 * nx), *rdw = xmalloc(4 * nw);
	void *hp[8] = { rl, rdx, rdw, s.x, s.w, s.tgt, xmalloc(4 * nr), xmalloc(2 * nr) };
	memcpy(rdx, s.dx0, 4 * nx);
	memcpy(rdw, s.dw0, 4 * nw);
	struct st_op op = head_op(hp, N, C, V, R, dloss);
	st_compute_run(st_compute_cpu(), &op);
	int rc = st_compute_sync(st_compute_cpu());
	if (rc)
		die("the cpu compute's run", rc);

	float *gl, *gdx, *gdw, *gl2, *gdx2, *gdw2, *fl, *unused = NULL;
	gpu_run(&s, true, dloss, &gl, &gdx, &gdw);
	expect(shape, "loss", gl, rl, NULL, (size_t)N, 1e-5);
	expect(shape, "dx added", gdx, rdx, s.dx0, nx, 1e-3);
	expect(shape, "dW added", gdw, rdw, s.dw0, nw, 1e-3);
	gpu_run(&s, true, dloss, &gl2, &gdx2, &gdw2);
	expect_same(shape, "rerun loss", gl, gl2, (size_t)N);
	expect_same(shape, "rerun dx", gdx, gdx2, nx);
	expect_same(shape, "rerun dW", gdw, gdw2, nw);
	gpu_run(&s, false, dloss, &fl, &unused, &unused);
	expect_same(shape, "forward alone's loss", gl, fl, (size_t)N);

	free(gl), free(gdx), free(gdw), free(gl2), free(gdx2), free(gdw2), free(fl);
	free(rl), free(rdx), free(rdw), free(hp[6]), free(hp[7]);
	data_free(&s);
}

static void check_supports(void)
{
	const enum st_dtype F = ST_DTYPE_F32, BF = ST_DTYPE_BF16, I = ST_DTYPE_I32;
	const enum st_dtype ok[] = { F, F, F, BF, BF, I, F, BF };
	const enum st_dtype x_f32[] = { F, F, F, F, BF, I, F, BF };
	const enum st_dtype dx_bf16[] = { F, BF, F, BF, BF, I, F, BF };

	if (!st_compute_supports(cx, ST_OP_HEAD_CROSSENTROPY, ok) ||
	    st_compute_supports(cx, ST_OP_HEAD_CROSSENTROPY, x_f32) ||
	    st_compute_supports(cx, ST_OP_HEAD_CROSSENTROPY, dx_bf16)) {
		fprintf(stderr, "FAIL supports: head_crossentropy's signature\n");
		fails++;
		return;
	}
	printf("ok   supports: head_crossentropy's signature, others refused\n");
}

/* ---- --bench ------------------------------------------------------------- */

static void unfused_rec(void *arg, const struct st_op *rec)
{
	st_compute_run(arg, rec);
}

/* GPU ms of one call: the fused op, or its unfused records. */
static double timed(struct data *s, bool fused, bool bwd, float dloss)
{
	void *p[8];
	struct st_compute_span sp;

	memcpy(p, s->d, sizeof(p));
	if (!bwd)
		p[1] = p[2] = NULL;
	struct st_op op = head_op(p, s->N, s->C, s->V, s->R, dloss);
	st_compute_span_begin(cx, "head");
	if (fused)
		st_compute_run(cx, &op);
	else
		st_op_head_ce_unfold(&op, unfused_rec, cx);
	st_compute_span_end(cx);
	int rc = st_compute_sync(cx);
	if (rc)
		die(fused ? "the fused op" : "the unfused records", rc);
	if (st_compute_take_spans(cx, &sp, 1) != 1)
		die("no span came back", -EIO);
	return (double)(sp.t1_ns - sp.t0_ns) / 1e6;
}

static int bench(const char *json)
{
	enum { ROUNDS = 10 };
	const int N = 8192, C = 768, V = 50257, R = 256;
	const float dloss = 1.0f / (float)N;
	double t[2][2][ROUNDS]; /* [bwd][fused][round] */
	struct data s;

	data_make(&s, N, C, V, R);
	for (int bwd = 0; bwd < 2; bwd++)
		for (int f = 0; f < 2; f++)
			(void)timed(&s, f, bwd, dloss); /* warm-up: cuBLASLt's plans, caches */
	for (int r = 0; r < ROUNDS; r++)
		for (int bwd = 0; bwd < 2; bwd++)
			for (int f = 0; f < 2; f++)
				t[bwd][f][r] = timed(&s, f, bwd, dloss);
	double m[2][2];
	for (int bwd = 0; bwd < 2; bwd++)
		for (int f = 0; f < 2; f++)
			m[bwd][f] = bench_median(t[bwd][f], ROUNDS);
	const double flop = 2.0 * N * (double)V * C; /* one product */
	printf("== head + cross-entropy, gpt2 B=8 T=1024 (N=%d C=%d V=%d), bf16, GPU ms, "
	       "medians of %d interleaved\n",
	       N, C, V, ROUNDS);
	printf("%-34s %10s %10s %12s\n", "call", "unfused", "fused", "unfused/fused");
	printf("%-34s %10.3f %10.3f %12.3f\n", "forward (loss)", m[0][0], m[0][1],
	       m[0][0] / m[0][1]);
	printf("%-34s %10.3f %10.3f %12.3f\n", "backward call (loss, dx, dW)", m[1][0], m[1][1],
	       m[1][0] / m[1][1]);
	printf("unfused TFLOP/s (1 and 3 products): forward %.1f, backward call %.1f\n",
	       flop / (m[0][0] * 1e9), 3 * flop / (m[1][0] * 1e9));
	if (json) {
		FILE *f = fopen(json, "w");
		if (!f) {
			fprintf(stderr, "test_cuda_head_ce: %s: %s\n", json, strerror(errno));
			data_free(&s);
			return 1;
		}
		fprintf(f,
			"{\"N\": %d, \"C\": %d, \"V\": %d, \"rounds\": %d, \"fwd_unfused_ms\": %.4f, "
			"\"fwd_fused_ms\": %.4f, \"bwd_unfused_ms\": %.4f, \"bwd_fused_ms\": %.4f}\n",
			N, C, V, ROUNDS, m[0][0], m[0][1], m[1][0], m[1][1]);
		if (fclose(f)) {
			fprintf(stderr, "test_cuda_head_ce: %s: %s\n", json, strerror(errno));
			data_free(&s);
			return 1;
		}
	}
	data_free(&s);
	return 0;
}

int main(int argc, char **argv)
{
	bool do_bench = false;
	const char *json = NULL;

	for (int a = 1; a < argc; a++) {
		if (strcmp(argv[a], "--bench") == 0) {
			do_bench = true;
		} else if (strcmp(argv[a], "--json") == 0 && a + 1 < argc) {
			json = argv[++a];
		} else {
			bool help = strcmp(argv[a], "--help") == 0;
			fprintf(help ? stdout : stderr,
				"usage: %s [--bench [--json FILE]]\n(the fused bf16 head + "
				"cross-entropy on the GPU against the cpu's; --bench then times it "
				"against the unfused records; exit 77 without a GPU; ST_TEST_SMALL=1: "
				"small shapes)\n",
				argv[0]);
			return help ? 0 : 2;
		}
	}
	if (json && !do_bench) {
		fprintf(stderr, "test_cuda_head_ce: --json needs --bench\n");
		return 2;
	}
	const char *small = getenv("ST_TEST_SMALL");

	gpu_open();
	check_supports();
	if (small && strcmp(small, "0") != 0) {
		printf("small shapes (ST_TEST_SMALL)\n");
		check(130, 264, 333, 64);
	} else {
		check(512, 768, 50257, 256); /* GPT-2's head, two chunks of the cpu's loop */
	}
	check(70, 136, 200, 16);
	check(33, 37, 77, 16);
	check(1, 64, 1000, 256);
	printf("%s\n", fails ? "FAILED" : "all ok");
	int rc = 0;
	if (!fails && do_bench)
		rc = bench(json);
	st_compute_destroy(cx);
	return fails ? 1 : rc;
}
