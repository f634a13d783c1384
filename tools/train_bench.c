/* train-bench: forward + backward over every unit of a GPT-2 on the cpu
 * device, against a large sgemm through the same BLAS and thread count.
 *
 * Each step is what a training step does minus the optimizer: W is kept in
 * bf16 and widened to fp32 once per use (forward and backward), the forward
 * keeps each unit's input, the backward recomputes each unit from it (or,
 * --recompute none, reads the forward each block kept in a saved buffer of
 * its own: strata/model.h's st_model_fwd_save) and accumulates dW into fp32
 * gradient buffers. Steps and sgemm runs are interleaved; medians are
 * reported; --recompute both alternates the two kinds of step in every
 * round and reports each, and the median of the per-round ratio. */
#include "strata/kernels.h"
#include "strata/model.h"
#include "bench_out.h"
#include "bench_stats.h"

#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <json-c/json.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f)
{
	fprintf(f,
		"usage: train-bench [options]\n"
		"  --steps N     timed steps (default 3; one untimed warm-up step runs first)\n"
		"  --batch B     sequences per step (default 4)\n"
		"  --seq T       tokens per sequence (default 64)\n"
		"  --model M     %s, or layers=L,dim=C,heads=H,vocab=V,ctx=T (default gpt2)\n"
		"  --threads N   OpenMP threads for kernels and BLAS (default: OpenMP's)\n"
"  --recompute all|none|both  the backward recomputes every block's forward\n"
"                (all, default), reads what each block's forward kept (none),\n"
"                or both in turn in every round, each reported\n"
		"  --json FILE   also write the results as JSON\n"
		"  --help        this text\n"
		"Prints tokens/s, model FLOP/s (6*N_mm + 6*L*T*C per token; see\n"
		"st_model_flops_per_token; recompute not counted) and their ratio to a\n"
		"2048^3 sgemm's rate measured in the same rounds.\n",
		st_model_preset_list());
}

static int bad(const char *fmt, const char *arg)
{
	fprintf(stderr, "train-bench: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, " (see --help)\n");
	return 2;
}

/* The BLAS this process really runs, as the dynamic loader mapped it: the
 * real path of every mapped file whose name says BLAS (OpenBLAS and its
 * libblas.so.3 wrapper, BLIS, MKL, FlexiBLAS), read from /proc/self/maps,
 * ';'-separated into out. tools/torch-ref bench compares it with what
 * PyTorch's process mapped. */
static void blas_mapped(char *out, size_t cap)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[PATH_MAX + 256];
	size_t len = 0;

	out[0] = '\0';
	if (!f) {
		snprintf(out, cap, "unknown (/proc/self/maps: %s)", strerror(errno));
		return;
	}
	while (fgets(line, sizeof(line), f)) {
		char *path = strchr(line, '/'), real[PATH_MAX];
		const char *base;

		if (!path)
			continue;
		path[strcspn(path, "\n")] = '\0';
		base = strrchr(path, '/') + 1;
		if (!strstr(base, "blas") && !strstr(base, "blis") && !strstr(base, "mkl_"))
			continue;
		if (!realpath(path, real))
			snprintf(real, sizeof(real), "%s", path);
		if (strstr(out, real)) /* one entry per file (maps lists each segment) */
			continue;
		len += (size_t)snprintf(out + len, len < cap ? cap - len : 0, "%s%s",
					len ? ";" : "", real);
		if (len >= cap)
			break;
	}
	fclose(f);
	if (!out[0])
		snprintf(out, cap, "none mapped");
}

static const char *blas_threading(void)
{
	switch (openblas_get_parallel()) {
	case 0: return "sequential";
	case 1: return "pthreads";
	case 2: return "openmp";
	}
	return "unknown";
}

/* CPU seconds of the whole process (all threads): on a shared machine a
 * steadier figure than the wall clock, which also counts the time the
 * threads waited for a core (OMP_WAIT_POLICY=PASSIVE: no spinning). */
static double cpu_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double now_s(void)
{
	return (double)st_now_ns() * 1e-9;
}

/* One 2048^3 sgemm as BLAS runs it (its own threading): the rate to beat. */
static double sgemm_seconds(const float *a, const float *b, float *c, int n)
{
	double t0 = now_s();
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a,
		    n, b, n, 0.0f, c, n);
	return now_s() - t0;
}

struct bench {
	struct st_model *m;
	int U, B, T, C;
	uint16_t **w;      /* W[u], bf16 */
	float **g;         /* G[u], fp32 */
	float *pu, *pemb;  /* fp32 views: the current unit, the embedding */
	float **x;         /* x[u], unit inputs (B,T,C) */
	float *d[2];
	void *work;
	size_t work_bytes;
	void **saved;      /* saved[u]: block u's kept forward (--recompute none) */
	size_t *saved_bytes;
	struct st_model_batch batch;
};

/* One step; keep: every block keeps its forward for its backward. */
static int step(struct bench *s, float *loss, bool keep)
{
	const int last = s->U - 1;
	int err;
	for (int u = 0; u < s->U; u++)
		st_cpu_zero(s->g[u], st_model_unit_layout(s->m, u)->elems * sizeof(float));
	// forward: widen W[u], run, keep the input of the next unit
	st_cpu_bf16_to_f32(s->pemb, s->w[0], st_model_unit_layout(s->m, 0)->elems);
	/* The head's forward is skipped: its backward recomputes it and
	 * returns the loss, which is how a training step should run it. */
	for (int u = 0; u < last; u++) {
		float *p = u == 0 ? s->pemb : s->pu;
		if (u > 0)
			st_cpu_bf16_to_f32(p, s->w[u], st_model_unit_layout(s->m, u)->elems);
		err = st_model_fwd_save(s->m, u, &s->batch, p, NULL, s->x[u], s->x[u + 1], loss,
					keep ? s->saved[u] : NULL, s->saved_bytes[u], s->work,
					s->work_bytes);
		if (err)
			return err;
	}
	// backward: recompute from x[u]; the head also gives the loss
	int cur = 0;
	for (int u = last; u >= 0; u--) {
		float *p = u == 0 ? s->pemb : s->pu;
		if (u > 0)
			st_cpu_bf16_to_f32(p, s->w[u], st_model_unit_layout(s->m, u)->elems);
		err = st_model_bwd_saved(s->m, u, &s->batch, p, u == last ? s->pemb : NULL,
					 s->x[u], s->d[cur], u > 0 ? s->d[cur ^ 1] : NULL,
					 s->g[u], u == last ? s->g[0] : NULL,
					 u == last ? loss : NULL, keep ? s->saved[u] : NULL,
					 s->saved_bytes[u], s->work, s->work_bytes);
		if (err)
			return err;
		cur ^= 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	int steps = 3, B = 4, T = 64, threads = 0;
	const char *model = "gpt2", *json_path = NULL, *recompute = "all";
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			return 0;
		}
		if (i + 1 >= argc)
			return bad("unknown option or missing value: '%s'", a);
		const char *v = argv[++i];
		if (!strcmp(a, "--steps")) {
			if (bench_parse_int(v, 1, 1000000, &steps))
				return bad("--steps needs an integer >= 1, got '%s'", v);
		} else if (!strcmp(a, "--batch")) {
			if (bench_parse_int(v, 1, 1 << 20, &B))
				return bad("--batch needs an integer >= 1, got '%s'", v);
		} else if (!strcmp(a, "--seq")) {
			if (bench_parse_int(v, 1, 1 << 20, &T))
				return bad("--seq needs an integer >= 1, got '%s'", v);
		} else if (!strcmp(a, "--threads")) {
			if (bench_parse_int(v, 1, 4096, &threads))
				return bad("--threads needs an integer >= 1, got '%s'", v);
		} else if (!strcmp(a, "--model")) {
			model = v;
		} else if (!strcmp(a, "--recompute")) {
			if (strcmp(v, "all") && strcmp(v, "none") && strcmp(v, "both"))
				return bad("--recompute needs all, none or both, got '%s'", v);
			recompute = v;
		} else if (!strcmp(a, "--json")) {
			json_path = v;
		} else {
			return bad("unknown option '%s'", a);
		}
	}
	struct st_model_config cfg;
	if (st_model_config_parse(model, &cfg))
		return bad("%s", st_error_last());
	if (T > cfg.ctx) {
		fprintf(stderr, "train-bench: --seq %d exceeds the model's ctx %d (see --help)\n",
			T, cfg.ctx);
		return 2;
	}
	if (json_path)
		bench_out_check("train-bench", "--json", json_path);
	if (threads)
		omp_set_num_threads(threads);
	threads = omp_get_max_threads();

	struct bench s = {.B = B, .T = T, .C = cfg.dim};
	if (st_model_create(&cfg, &s.m)) {
		fprintf(stderr, "train-bench: %s\n", st_error_last());
		return 1;
	}
	s.U = st_model_unit_count(s.m);
	s.w = calloc((size_t)s.U, sizeof(*s.w));
	s.g = calloc((size_t)s.U, sizeof(*s.g));
	s.x = calloc((size_t)s.U, sizeof(*s.x));
	s.saved = calloc((size_t)s.U, sizeof(*s.saved));
	s.saved_bytes = calloc((size_t)s.U, sizeof(*s.saved_bytes));
	/* modes[i]: the steps of each round, in turn (keep or not) */
	const bool both = !strcmp(recompute, "both"), keep1 = !strcmp(recompute, "none");
	const int nmodes = both ? 2 : 1;
	const bool modes[2] = { both ? false : keep1, true };
	size_t saved_total = 0;
	size_t max_elems = 0;
	size_t act = (size_t)B * T * cfg.dim;
	int32_t *tok = malloc((size_t)B * T * sizeof(int32_t));
	int32_t *tgt = malloc((size_t)B * T * sizeof(int32_t));
	int ok = s.w && s.g && s.x && s.saved && s.saved_bytes && tok && tgt;
	for (int u = 0; ok && u < s.U; u++) {
		const struct st_unit_layout *ul = st_model_unit_layout(s.m, u);
		if (u > 0 && ul->elems > max_elems)
			max_elems = ul->elems;
		size_t wb = st_model_work_bytes(s.m, u, B, T);
		s.work_bytes = wb > s.work_bytes ? wb : s.work_bytes;
		s.w[u] = malloc(ul->elems * sizeof(uint16_t));
		s.g[u] = malloc(ul->elems * sizeof(float));
		s.x[u] = malloc(act * sizeof(float));
		ok = s.w[u] && s.g[u] && s.x[u];
		size_t scratch;
		s.saved_bytes[u] = st_model_saved_bytes(s.m, u, B, T, &scratch);
		if (ok && s.saved_bytes[u] && (both || keep1)) {
			s.saved[u] = malloc(s.saved_bytes[u]);
			ok = s.saved[u] != NULL;
			saved_total += s.saved_bytes[u];
		}
	}
	s.pemb = ok ? malloc(st_model_unit_layout(s.m, 0)->elems * sizeof(float)) : NULL;
	s.pu = ok ? malloc(max_elems * sizeof(float)) : NULL;
	s.d[0] = malloc(act * sizeof(float));
	s.d[1] = malloc(act * sizeof(float));
	s.work = malloc(s.work_bytes);
	if (!ok || !s.pemb || !s.pu || !s.d[0] || !s.d[1] || !s.work) {
		fprintf(stderr, "train-bench: out of memory\n");
		return 1;
	}
	// init: fp32 master per unit, rounded to the bf16 W
	for (int u = 0; u < s.U; u++) {
		const struct st_unit_layout *ul = st_model_unit_layout(s.m, u);
		float *p = u == 0 ? s.pemb : s.pu;
		st_model_init_unit(s.m, u, 1234, p);
		st_cpu_f32_to_bf16(s.w[u], p, ul->elems);
	}
	uint64_t r = 88172645463325252ull;
	for (int i = 0; i < B * T; i++) { /* xorshift: fixed, cheap tokens */
		r ^= r << 13, r ^= r >> 7, r ^= r << 17;
		tok[i] = (int32_t)(r % (uint64_t)cfg.vocab);
		tgt[i] = (int32_t)((r >> 32) % (uint64_t)cfg.vocab);
	}
	s.batch = (struct st_model_batch){.B = B, .T = T, .tokens = tok,
					  .targets = tgt, .loss_scale = 1.0f};

	const int n = 2048;
	float *ga = malloc((size_t)n * n * 4), *gb = malloc((size_t)n * n * 4);
	float *gc = malloc((size_t)n * n * 4);
	if (!ga || !gb || !gc) {
		fprintf(stderr, "train-bench: out of memory\n");
		return 1;
	}
	for (size_t i = 0; i < (size_t)n * n; i++) {
		ga[i] = (float)(i % 7) * 0.1f;
		gb[i] = (float)(i % 5) * 0.1f;
	}

	float loss = 0.0f, loss_m[2] = { 0, 0 };
	int err = 0;
	for (int k = 0; k < nmodes && !err; k++) /* warm-up: page faults, BLAS buffers */
		err = step(&s, &loss_m[k], modes[k]);
	sgemm_seconds(ga, gb, gc, n);
	if (err) {
		fprintf(stderr, "train-bench: %s\n", st_error_last());
		return 1;
	}
	/* per mode: step wall and cpu seconds, sgemm seconds after it */
	double *ts = calloc((size_t)steps * 2, sizeof(double));
	double *tg = calloc((size_t)steps * 2, sizeof(double));
	double *tcpu = calloc((size_t)steps * 2, sizeof(double));
	double *tgc = calloc((size_t)steps * 2, sizeof(double));
	double *rr = calloc((size_t)steps, sizeof(double));
	if (!ts || !tg || !tcpu || !tgc || !rr) {
		fprintf(stderr, "train-bench: out of memory\n");
		return 1;
	}
	for (int i = 0; i < steps; i++) {
		for (int k = 0; k < nmodes; k++) {
			/* both: the order alternates by round */
			int mk = both && i % 2 ? 1 - k : k;
			double t0 = now_s(), c0 = cpu_s();
			err = step(&s, &loss_m[mk], modes[mk]);
			ts[mk * steps + i] = now_s() - t0;
			tcpu[mk * steps + i] = cpu_s() - c0;
			if (err) {
				fprintf(stderr, "train-bench: %s\n", st_error_last());
				return 1;
			}
			c0 = cpu_s();
			tg[mk * steps + i] = sgemm_seconds(ga, gb, gc, n);
			tgc[mk * steps + i] = cpu_s() - c0;
		}
		if (both)
			rr[i] = ts[i] / ts[steps + i];
	}
	loss = loss_m[0];
	if (both && memcmp(&loss_m[0], &loss_m[1], sizeof(float))) {
		fprintf(stderr, "train-bench: the kept step's loss %.9g is not the recomputing "
			"one's %.9g\n", (double)loss_m[1], (double)loss_m[0]);
		return 1;
	}
	double tokens = (double)B * T;
	double flops_tok = st_model_flops_per_token(s.m, T);
	double step_s = 0, gemm_s = 0, step_cpu_s = 0, model_flops = 0, gemm_flops = 0, ratio = 0;
	/* per mode: step s, sgemm s, step cpu s, model FLOP/s, ratio, sgemm
	 * cpu s, ratio in cpu seconds (FLOPs per cpu second of the step over
	 * the sgemm's: what the wall clock of a shared machine blurs) */
	double res[2][7];
	for (int k = 0; k < nmodes; k++) {
		res[k][0] = bench_median(ts + k * steps, steps);
		res[k][1] = bench_median(tg + k * steps, steps);
		res[k][2] = bench_median(tcpu + k * steps, steps);
		res[k][3] = flops_tok * tokens / res[k][0];
		res[k][4] = res[k][3] / (2.0 * n * (double)n * n / res[k][1]);
		res[k][5] = bench_median(tgc + k * steps, steps);
		res[k][6] = (flops_tok * tokens / res[k][2]) / (2.0 * n * (double)n * n / res[k][5]);
	}
	step_s = res[0][0];
	gemm_s = res[0][1];
	step_cpu_s = res[0][2];
	model_flops = res[0][3];
	gemm_flops = 2.0 * n * (double)n * n / gemm_s;
	ratio = res[0][4];

	printf("model %s: L=%d C=%d H=%d V=%d, %.1fM params; B=%d T=%d, %d threads, %d steps\n",
	       model, cfg.n_layer, cfg.dim, cfg.n_head, cfg.vocab,
	       (double)st_model_param_count(s.m) / 1e6, B, T, threads, steps);
	for (int k = 0; k < nmodes; k++) {
		const char *what = modes[k] ? "fwd + bwd, every block's forward kept (recompute none)"
					    : "fwd + bwd with recompute";
		double gf = 2.0 * n * (double)n * n / res[k][1];
		printf("step (%s, W bf16): median %.3f s, loss %.4f (ln V = %.4f)\n", what,
		       res[k][0], (double)loss_m[k], log((double)cfg.vocab));
		printf("step cpu time (all threads): median %.3f s\n", res[k][2]);
		printf("tokens/s: %.1f\n", tokens / res[k][0]);
		printf("model FLOP/s: %.2f GFLOP/s (6*N_mm + 6*L*T*C = %.3g FLOP/token)\n",
		       res[k][3] / 1e9, flops_tok);
		printf("sgemm %dx%dx%d: median %.2f GFLOP/s\n", n, n, n, gf / 1e9);
		printf("ratio model/sgemm: %.3f\n", res[k][4]);
		printf("ratio model/sgemm in cpu seconds: %.3f (sgemm cpu median %.3f s)\n",
		       res[k][6], res[k][5]);
	}
	double keep_speedup = both ? bench_median(rr, steps) : 0;
	if (both)
		printf("recompute all / none, step time per round: median %.3f (saved forwards "
		       "%.1f MiB)\n", keep_speedup, (double)saved_total / (1 << 20));
	char blas[4096];
	blas_mapped(blas, sizeof(blas));
	printf("blas: %s (%s, core %s, %s threading)\n", blas, openblas_get_config(),
	       openblas_get_corename(), blas_threading());

	if (json_path) {
		json_object *o = json_object_new_object();
		json_object_object_add(o, "model", json_object_new_string(model));
		json_object_object_add(o, "batch", json_object_new_int(B));
		json_object_object_add(o, "seq", json_object_new_int(T));
		json_object_object_add(o, "threads", json_object_new_int(threads));
		json_object_object_add(o, "steps", json_object_new_int(steps));
		json_object_object_add(o, "recompute", json_object_new_string(recompute));
		json_object_object_add(o, "params", json_object_new_int64((int64_t)st_model_param_count(s.m)));
		/* the first mode's (both: recompute all's) */
		json_object_object_add(o, "step_s_median", json_object_new_double(step_s));
		json_object_object_add(o, "step_cpu_s_median", json_object_new_double(step_cpu_s));
		json_object_object_add(o, "tokens_per_s", json_object_new_double(tokens / step_s));
		json_object_object_add(o, "flops_per_token", json_object_new_double(flops_tok));
		json_object_object_add(o, "model_flops_per_s", json_object_new_double(model_flops));
		json_object_object_add(o, "sgemm_flops_per_s", json_object_new_double(gemm_flops));
		json_object_object_add(o, "ratio", json_object_new_double(ratio));
		json_object_object_add(o, "sgemm_cpu_s_median", json_object_new_double(res[0][5]));
		json_object_object_add(o, "ratio_cpu", json_object_new_double(res[0][6]));
		json_object_object_add(o, "loss", json_object_new_double(loss));
		if (both) {
			json_object *k = json_object_new_object();
			json_object_object_add(k, "step_s_median", json_object_new_double(res[1][0]));
			json_object_object_add(k, "step_cpu_s_median", json_object_new_double(res[1][2]));
			json_object_object_add(k, "model_flops_per_s", json_object_new_double(res[1][3]));
			json_object_object_add(k, "sgemm_flops_per_s",
					       json_object_new_double(2.0 * n * (double)n * n / res[1][1]));
			json_object_object_add(k, "ratio", json_object_new_double(res[1][4]));
			json_object_object_add(k, "ratio_cpu", json_object_new_double(res[1][6]));
			json_object_object_add(o, "kept", k);
			json_object_object_add(o, "all_over_none_median", json_object_new_double(keep_speedup));
		}
		json_object_object_add(o, "saved_bytes", json_object_new_int64((int64_t)saved_total));
		json_object_object_add(o, "blas_mapped", json_object_new_string(blas));
		json_object_object_add(o, "blas_config", json_object_new_string(openblas_get_config()));
		json_object_object_add(o, "blas_core", json_object_new_string(openblas_get_corename()));
		json_object_object_add(o, "blas_threading", json_object_new_string(blas_threading()));
		if (bench_out_write("train-bench", json_path,
				    json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY)) < 0) {
			json_object_put(o);
			exit(1); /* its buffers stay reachable, for LeakSanitizer */
		}
		json_object_put(o);
	}

	for (int u = 0; u < s.U; u++) {
		free(s.w[u]);
		free(s.g[u]);
		free(s.x[u]);
		free(s.saved[u]);
	}
	free(s.saved); free(s.saved_bytes); free(rr); free(tgc);
	free(s.w); free(s.g); free(s.x); free(s.pemb); free(s.pu);
	free(s.d[0]); free(s.d[1]); free(s.work); free(tok); free(tgt);
	free(ga); free(gb); free(gc); free(ts); free(tg); free(tcpu);
	st_model_destroy(s.m);
	return 0;
}
