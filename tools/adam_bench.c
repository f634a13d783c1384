/* adam-bench: how close the fused CPU AdamW step runs to memory speed.
 *
 * In one run, interleaved rep by rep (the machine is noisy, so each
 * figure's median comes from the same stretch of time): a STREAM-style
 * triad for the machine's memory bandwidth; "stream30", a loop that moves
 * exactly the step's bytes with next to no arithmetic (the streaming bound
 * for those bytes); the fused AdamW step from src/optim on N parameters
 * (fp32 G, P, M, V; bf16 W); and a naive C AdamW loop for reference. All
 * use the same OpenMP thread count.
 *
 * Byte counts follow STREAM's convention: bytes the loop must read plus
 * bytes it must write, without write-allocate traffic. Triad: 12 B per fp32
 * element (read b, c; write a). Adam and stream30: 30 B per parameter (read
 * G, P, M, V; write P, M, V, W).
 *
 * --optim-state bf16|q8 times the step with compact M and V instead (22 and
 * about 18 B per parameter); --optim-state all times fp32, bf16 and q8, each
 * on its own state arrays, interleaved in every round (rotating order), and
 * reports the medians of per-round ratios of params/s against fp32. */
#include "strata/common.h"
#include "strata/optim.h"
#include "bench_out.h"
#include "bench_stats.h"

#include <errno.h>
#include <immintrin.h>
#include <json-c/json.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define TRIAD_ELEMS (64ull * 1000 * 1000) /* 768 MB of arrays: past any cache */

struct opts {
	uint64_t params;
	int threads;
	int reps;
	int have_path;
	enum st_optim_path path;
	int state; /* an enum st_optim_state, or ST_BENCH_STATE_ALL */
	const char *json;
};

#define ST_BENCH_STATE_ALL 3
#define N_STATES 3

static void usage(FILE *f)
{
	fprintf(f,
		"usage: adam-bench [--params N] [--threads T] [--path avx512|avx2|scalar]\n"
		"                  [--optim-state fp32|bf16|q8|all] [--reps R] [--json FILE]\n"
		"  --params N   parameters per step (default 100M; suffixes k, M, G are x1000)\n"
		"  --threads T  OpenMP threads for triad, stream30, Adam and the naive loop\n"
		"               (default: OpenMP's)\n"
		"  --path P     force the kernel path (default: the best this CPU has, or\n"
		"               $ST_OPTIM_PATH)\n"
		"  --optim-state S  M and V in fp32 (default), bf16 or q8; all: the three\n"
		"               interleaved in each round, with medians of per-round ratios\n"
		"               of params/s against fp32\n"
		"  --reps R     timed repetitions of each, interleaved (default 9; median taken)\n"
		"  --json FILE  also write the results as JSON\n"
		"Interleaved rep by rep: a triad (64M floats), stream30 (the step's 30 B per\n"
		"parameter moved with next to no arithmetic: the streaming bound for those\n"
		"bytes), the fused AdamW step, a naive AdamW loop. Prints each one's rate and\n"
		"the step's ratios to the triad and to stream30.\n");
}

static int parse_count(const char *s, uint64_t *out)
{
	char *end;
	double v, mult = 1.0;

	if (!s || !*s || !(*s >= '0' && *s <= '9'))
		return -EINVAL;
	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s)
		return -EINVAL;
	switch (*end) {
	case 'k': case 'K': mult = 1e3; end++; break;
	case 'm': case 'M': mult = 1e6; end++; break;
	case 'g': case 'G': mult = 1e9; end++; break;
	}
	if (*end || !isfinite(v * mult) || v * mult >= 1e15 || v * mult != floor(v * mult))
		return -EINVAL;
	*out = (uint64_t)(v * mult);
	return 0;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
		uint64_t x;

		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			exit(0);
		}
		if (strcmp(a, "--params") && strcmp(a, "--threads") && strcmp(a, "--path") &&
		    strcmp(a, "--reps") && strcmp(a, "--json") && strcmp(a, "--optim-state")) {
			fprintf(stderr, "adam-bench: unknown argument '%s' (see --help)\n", a);
			return -EINVAL;
		}
		if (!val) {
			fprintf(stderr, "adam-bench: %s needs a value\n", a);
			return -EINVAL;
		}
		i++;
		if (!strcmp(a, "--params")) {
			if (parse_count(val, &x) || x == 0) {
				fprintf(stderr, "adam-bench: --params '%s': want a count >= 1 such as 100M\n",
					val);
				return -EINVAL;
			}
			o->params = x;
		} else if (!strcmp(a, "--threads") || !strcmp(a, "--reps")) {
			if (parse_count(val, &x) || x == 0 || x > 4096) {
				fprintf(stderr, "adam-bench: %s '%s': want an integer in 1..4096\n", a, val);
				return -EINVAL;
			}
			if (!strcmp(a, "--threads"))
				o->threads = (int)x;
			else
				o->reps = (int)x;
		} else if (!strcmp(a, "--optim-state")) {
			enum st_optim_state st;

			if (!strcmp(val, "all")) {
				o->state = ST_BENCH_STATE_ALL;
			} else if (st_optim_state_parse(val, &st)) {
				fprintf(stderr,
					"adam-bench: --optim-state '%s': want fp32, bf16, q8 or all\n",
					val);
				return -EINVAL;
			} else {
				o->state = (int)st;
			}
		} else if (!strcmp(a, "--path")) {
			if (st_optim_path_parse(val, &o->path)) {
				fprintf(stderr, "adam-bench: --path '%s': want avx512, avx2, scalar or auto\n",
					val);
				return -EINVAL;
			}
			if (!st_optim_path_supported(o->path)) {
				fprintf(stderr, "adam-bench: --path %s: this CPU does not support it\n", val);
				return -EINVAL;
			}
			o->have_path = 1;
		} else {
			if (!*val) {
				fprintf(stderr, "adam-bench: --json needs a file name\n");
				return -EINVAL;
			}
			o->json = val;
		}
	}
	if (o->json)
		bench_out_check("adam-bench", "--json", o->json);
	return 0;
}

/* 2 MiB-aligned, so transparent huge pages can back it. */
static void *alloc_big(size_t bytes)
{
	size_t len = st_align_up(bytes, 2 * ST_MiB);
	void *p = aligned_alloc(2 * ST_MiB, len);

	if (p)
		madvise(p, len, MADV_HUGEPAGE);
	return p;
}

/* A cheap deterministic value in [-1, 1) from an index. */
static float hashf(uint64_t i, uint64_t salt)
{
	uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull ^ salt;

	z = (z ^ (z >> 29)) * 0xbf58476d1ce4e5b9ull;
	z ^= z >> 32;
	return (float)((double)(z & 0xffffff) / 8388608.0 - 1.0);
}

static double now_s(void)
{
	return (double)st_now_ns() * 1e-9;
}

static double run_triad(float *a, const float *b, const float *c, size_t n)
{
	const float s = 0.5f;
	double t0 = now_s();

#pragma omp parallel for simd schedule(static)
	for (size_t i = 0; i < n; i++)
		a[i] = b[i] + s * c[i];
	return now_s() - t0;
}

static double run_adam(const struct st_adam_hparams *hp, const struct st_adam_bufs *b, size_t n)
{
	double t0 = now_s();
	int err = st_adam_update(hp, b, n, ST_ADAM_GRAD_CHECKED, NULL);

	if (err) {
		fprintf(stderr, "adam-bench: adam step: %s\n", st_error_last());
		exit(1);
	}
	return now_s() - t0;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define STREAM_X86 1
/* stream30's loop over [i, n): P, M and V each get G - G added (0, so the
 * values the Adam loops see stay the same), W the low half of P's bits,
 * with the fused step's own access pattern (its prefetch distance,
 * streaming stores for W from W's 32-byte boundary). The arithmetic is one
 * add per array, so what is left is the cost of moving the bytes. */
__attribute__((target("avx512f,avx512bw"))) static void
stream30_avx512(const float *g, float *p, float *m, float *v, uint16_t *w, size_t i, size_t n)
{
	for (; i < n && ((uintptr_t)(w + i) & 31); i++) {
		float z = g[i] - g[i];

		p[i] += z, m[i] += z, v[i] += z;
		w[i] = (uint16_t)st_f32_bits(p[i]);
	}
	for (; i + 16 <= n; i += 16) {
		__m512 gv = _mm512_loadu_ps(g + i), z = _mm512_sub_ps(gv, gv), pv;

		__builtin_prefetch((const char *)(g + i) + 2048, 0, 3);
		__builtin_prefetch((const char *)(p + i) + 2048, 0, 3);
		__builtin_prefetch((const char *)(m + i) + 2048, 0, 3);
		__builtin_prefetch((const char *)(v + i) + 2048, 0, 3);
		pv = _mm512_add_ps(_mm512_loadu_ps(p + i), z);
		_mm512_storeu_ps(p + i, pv);
		_mm512_storeu_ps(m + i, _mm512_add_ps(_mm512_loadu_ps(m + i), z));
		_mm512_storeu_ps(v + i, _mm512_add_ps(_mm512_loadu_ps(v + i), z));
		_mm256_stream_si256((__m256i *)(w + i), _mm512_cvtepi32_epi16(_mm512_castps_si512(pv)));
	}
	for (; i < n; i++) {
		float z = g[i] - g[i];

		p[i] += z, m[i] += z, v[i] += z;
		w[i] = (uint16_t)st_f32_bits(p[i]);
	}
	_mm_sfence();
}
#endif

/* The same bytes as the fused step: read G, P, M, V; write P, M, V, W. On
 * CPUs without AVX-512 a plain loop (then a weaker bound). */
static double run_stream30(const float *g, float *p, float *m, float *v, uint16_t *w, size_t n)
{
	const size_t chunk = 16384;
	size_t n_chunks = (n + chunk - 1) / chunk;
	double t0 = now_s();
#if defined(STREAM_X86)
	int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#else
	int avx512 = 0;
#endif

#pragma omp parallel for schedule(static)
	for (size_t c = 0; c < n_chunks; c++) {
		size_t a = c * chunk, b = ST_MIN(n, a + chunk);

#if defined(STREAM_X86)
		if (avx512) {
			stream30_avx512(g, p, m, v, w, a, b);
			continue;
		}
#endif
		(void)avx512;
		for (size_t i = a; i < b; i++) {
			float z = g[i] - g[i];

			p[i] += z, m[i] += z, v[i] += z;
			w[i] = (uint16_t)st_f32_bits(p[i]);
		}
	}
	return now_s() - t0;
}

/* The textbook AdamW loop as one would first write it. */
static double run_naive(const struct st_adam_hparams *hp, const float *g, float *p, float *m,
			float *v, uint16_t *w, size_t n)
{
	const float lr = hp->lr, b1 = hp->beta1, b2 = hp->beta2, eps = hp->eps;
	const float wd = hp->weight_decay, scale = hp->grad_scale;
	const float bc1 = 1.0f - powf(b1, (float)hp->step), bc2 = 1.0f - powf(b2, (float)hp->step);
	double t0 = now_s();

#pragma omp parallel for schedule(static)
	for (size_t i = 0; i < n; i++) {
		float gi = g[i] * scale;

		m[i] = b1 * m[i] + (1.0f - b1) * gi;
		v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
		float mhat = m[i] / bc1, vhat = v[i] / bc2;
		p[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
		w[i] = st_bf16_from_f32(p[i]);
	}
	return now_s() - t0;
}

/* The q-th quantile (0..1) of v[0..n), by sorting a copy (nearest rank). */
static double quantile(const double *v, int n, double q)
{
	double *c = malloc((size_t)n * sizeof(double)), r;

	if (!c)
		abort();
	memcpy(c, v, (size_t)n * sizeof(double));
	qsort(c, (size_t)n, sizeof(double), bench_cmp_double);
	r = c[(int)floor(q * (n - 1) + 0.5)];
	free(c);
	return r;
}

/* The step's bytes per parameter with fp32 G and bf16 W: G, P read and
 * written, W written, M and V read and written. */
static double step_bytes(enum st_optim_state st, size_t n)
{
	return 4.0 + 8.0 + 2.0 + 2.0 * (double)st_optim_state_bytes(st, n) / (double)n;
}

/* --optim-state all: fp32, bf16 and q8 steps, each on its own M and V (G,
 * P and W shared), in rotating order round by round; params/s and the
 * medians of per-round ratios against fp32. */
static int run_all(const struct opts *o, size_t n)
{
	const size_t nb = (n + ST_Q8_BLOCK - 1) / ST_Q8_BLOCK;
	struct st_adam_hparams hp = { .lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
				      .weight_decay = 0.01f, .grad_scale = 1.0f / 1024.0f };
	struct st_adam_bufs b[N_STATES];
	float *g = alloc_big(n * 4), *p = alloc_big(n * 4), *m = alloc_big(n * 4);
	float *v = alloc_big(n * 4), *ms = alloc_big(nb * 4), *vs = alloc_big(nb * 4);
	uint16_t *w = alloc_big(n * 2), *m16 = alloc_big(n * 2), *v16 = alloc_big(n * 2);
	uint8_t *m8 = alloc_big(n), *v8 = alloc_big(n);
	double *t[N_STATES], *ratio[N_STATES], med[N_STATES], rmed[N_STATES], rq1[N_STATES];
	double rq3[N_STATES], rmin[N_STATES], rmax[N_STATES];
	uint64_t step = 1;

	for (int f = 0; f < N_STATES; f++) {
		t[f] = calloc((size_t)o->reps, sizeof(double));
		ratio[f] = calloc((size_t)o->reps, sizeof(double));
		if (!t[f] || !ratio[f])
			abort();
	}
	if (!g || !p || !m || !v || !ms || !vs || !w || !m16 || !v16 || !m8 || !v8) {
		fprintf(stderr, "adam-bench: out of memory for %llu params\n",
			(unsigned long long)o->params);
		return 1;
	}
#pragma omp parallel for schedule(static)
	for (size_t i = 0; i < n; i++) {
		g[i] = hashf(i, 1);
		p[i] = 0.1f * hashf(i, 2);
		m[i] = v[i] = 0.0f;
		w[i] = m16[i] = v16[i] = 0;
		m8[i] = v8[i] = 0;
	}
	memset(ms, 0, nb * 4);
	memset(vs, 0, nb * 4);
	b[ST_OPTIM_STATE_F32] = (struct st_adam_bufs){ .g = g, .g_dtype = ST_OPTIM_F32, .p = p,
						       .m = m, .v = v, .w = w,
						       .w_dtype = ST_OPTIM_BF16 };
	b[ST_OPTIM_STATE_BF16] = b[ST_OPTIM_STATE_F32];
	b[ST_OPTIM_STATE_BF16].state = ST_OPTIM_STATE_BF16;
	b[ST_OPTIM_STATE_BF16].mc = m16;
	b[ST_OPTIM_STATE_BF16].vc = v16;
	b[ST_OPTIM_STATE_Q8] = b[ST_OPTIM_STATE_F32];
	b[ST_OPTIM_STATE_Q8].state = ST_OPTIM_STATE_Q8;
	b[ST_OPTIM_STATE_Q8].mc = m8;
	b[ST_OPTIM_STATE_Q8].vc = v8;
	b[ST_OPTIM_STATE_Q8].m_scale = ms;
	b[ST_OPTIM_STATE_Q8].v_scale = vs;

	for (int f = 0; f < N_STATES; f++) { /* warm-up */
		hp.step = step++;
		run_adam(&hp, &b[f], n);
	}
	for (int r = 0; r < o->reps; r++) {
		for (int k = 0; k < N_STATES; k++) {
			int f = (r + k) % N_STATES;

			hp.step = step++;
			t[f][r] = run_adam(&hp, &b[f], n);
		}
		for (int f = 0; f < N_STATES; f++)
			ratio[f][r] = t[0][r] / t[f][r];
	}
	printf("adam-bench: %llu params, %d threads, path %s, %d rounds of fp32, bf16, q8 "
	       "(rotating order)\n", (unsigned long long)o->params, o->threads,
	       st_optim_path_name(st_optim_path_get()), o->reps);
	for (int f = 0; f < N_STATES; f++) {
		med[f] = bench_median(t[f], o->reps);
		rmed[f] = bench_median(ratio[f], o->reps);
		rq1[f] = quantile(ratio[f], o->reps, 0.25);
		rq3[f] = quantile(ratio[f], o->reps, 0.75);
		rmin[f] = quantile(ratio[f], o->reps, 0.0);
		rmax[f] = quantile(ratio[f], o->reps, 1.0);
		printf("  %-5s %8.2f GB/s  (%.1f ms)  %.3g params/s  %.1f B/param", 
		       st_optim_state_name((enum st_optim_state)f),
		       (double)n * step_bytes((enum st_optim_state)f, n) / med[f] * 1e-9,
		       med[f] * 1e3, (double)n / med[f], step_bytes((enum st_optim_state)f, n));
		if (f)
			printf("  / fp32: median of per-round ratios %.3f (quartiles %.3f-%.3f, "
			       "range %.3f-%.3f)", rmed[f], rq1[f], rq3[f], rmin[f], rmax[f]);
		printf("\n");
	}
	if (o->json) {
		json_object *j = json_object_new_object();

		json_object_object_add(j, "params", json_object_new_int64((int64_t)o->params));
		json_object_object_add(j, "optim_state", json_object_new_string("all"));
		for (int f = 0; f < N_STATES; f++) {
			char key[64];
			const char *nm = st_optim_state_name((enum st_optim_state)f);

			snprintf(key, sizeof(key), "params_per_s_%s", nm);
			json_object_object_add(j, key, json_object_new_double((double)n / med[f]));
			if (!f)
				continue;
			snprintf(key, sizeof(key), "ratio_%s_to_fp32_median_per_round", nm);
			json_object_object_add(j, key, json_object_new_double(rmed[f]));
			snprintf(key, sizeof(key), "ratio_%s_to_fp32_q1", nm);
			json_object_object_add(j, key, json_object_new_double(rq1[f]));
			snprintf(key, sizeof(key), "ratio_%s_to_fp32_q3", nm);
			json_object_object_add(j, key, json_object_new_double(rq3[f]));
		}
		json_object_object_add(j, "path",
				       json_object_new_string(st_optim_path_name(st_optim_path_get())));
		json_object_object_add(j, "threads", json_object_new_int(o->threads));
		json_object_object_add(j, "reps", json_object_new_int(o->reps));
		if (bench_out_write("adam-bench", o->json,
				    json_object_to_json_string_ext(j, JSON_C_TO_STRING_PRETTY)) < 0) {
			json_object_put(j);
			exit(1);
		}
		json_object_put(j);
	}
	free(g);
	free(p);
	free(m);
	free(v);
	free(ms);
	free(vs);
	free(w);
	free(m16);
	free(v16);
	free(m8);
	free(v8);
	for (int f = 0; f < N_STATES; f++) {
		free(t[f]);
		free(ratio[f]);
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o = { .params = 100ull * 1000 * 1000, .threads = 0, .reps = 9 };
	size_t n, nt;
	float *g, *p, *m, *v, *ta, *tb, *tc;
	uint16_t *w;
	double *t_triad, *t_adam, *t_naive, *r_triad, *t_stream, *r_stream;
	struct st_adam_hparams hp = { .lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
				      .weight_decay = 0.01f, .grad_scale = 1.0f / 1024.0f };
	struct st_adam_bufs bufs;
	uint64_t step = 1;
	double bytes_per_param, med_triad, med_adam, med_naive, triad_gbps, adam_gbps;
	double naive_gbps, params_per_s, ratio, speedup, ratio_med, med_stream, stream_gbps;
	double stream_ratio, stream_ratio_med;

	if (parse_args(argc, argv, &o))
		return 2;
	if (o.threads)
		omp_set_num_threads(o.threads);
	else
		o.threads = omp_get_max_threads();
	if (o.have_path && st_optim_path_set(o.path)) {
		fprintf(stderr, "adam-bench: %s\n", st_error_last());
		return 2;
	}
	n = (size_t)o.params;
	nt = (size_t)TRIAD_ELEMS;
	if (o.state == ST_BENCH_STATE_ALL)
		return run_all(&o, n);

	g = alloc_big(n * 4);
	p = alloc_big(n * 4);
	/* one array holds the compact M (V) too: bf16 2 B, q8 1 B + the scales */
	m = alloc_big(n * 4 + (n / ST_Q8_BLOCK + 1) * 4);
	v = alloc_big(n * 4 + (n / ST_Q8_BLOCK + 1) * 4);
	w = alloc_big(n * 2);
	ta = alloc_big(nt * 4);
	tb = alloc_big(nt * 4);
	tc = alloc_big(nt * 4);
	t_triad = calloc((size_t)o.reps, sizeof(double));
	t_adam = calloc((size_t)o.reps, sizeof(double));
	t_naive = calloc((size_t)o.reps, sizeof(double));
	r_triad = calloc((size_t)o.reps, sizeof(double));
	t_stream = calloc((size_t)o.reps, sizeof(double));
	r_stream = calloc((size_t)o.reps, sizeof(double));
	if (!g || !p || !m || !v || !w || !ta || !tb || !tc || !t_triad || !t_adam || !t_naive ||
	    !r_triad || !t_stream || !r_stream) {
		fprintf(stderr, "adam-bench: out of memory for %llu params\n",
			(unsigned long long)o.params);
		return 1;
	}
	/* First touch by the threads that will use each page. */
#pragma omp parallel for schedule(static)
	for (size_t i = 0; i < n; i++) {
		g[i] = hashf(i, 1);
		p[i] = 0.1f * hashf(i, 2);
		m[i] = 0.0f;
		v[i] = 0.0f;
		w[i] = 0;
	}
#pragma omp parallel for schedule(static)
	for (size_t i = 0; i < nt; i++) {
		ta[i] = 0.0f;
		tb[i] = hashf(i, 3);
		tc[i] = hashf(i, 4);
	}
	bufs = (struct st_adam_bufs){ .g = g, .g_dtype = ST_OPTIM_F32, .p = p, .m = m, .v = v,
				      .w = w, .w_dtype = ST_OPTIM_BF16 };
	if (o.state != ST_OPTIM_STATE_F32) {
		/* the compact codes, then (q8) the scales, in M's and V's arrays;
		 * all zero, as in fp32 */
		size_t cb = o.state == ST_OPTIM_STATE_BF16 ? 2u : 1u;

		memset(m, 0, n * 4 + (n / ST_Q8_BLOCK + 1) * 4);
		memset(v, 0, n * 4 + (n / ST_Q8_BLOCK + 1) * 4);
		bufs.state = (enum st_optim_state)o.state;
		bufs.mc = m;
		bufs.vc = v;
		bufs.m_scale = (float *)((char *)m + st_align_up(n * cb, 64));
		bufs.v_scale = (float *)((char *)v + st_align_up(n * cb, 64));
	}
	bytes_per_param = step_bytes((enum st_optim_state)o.state, n);

	/* warm-up, then the timed reps, interleaved and alternating order */
	run_triad(ta, tb, tc, nt);
	run_stream30(g, p, m, v, w, n);
	hp.step = step++;
	run_adam(&hp, &bufs, n);
	hp.step = step++;
	run_naive(&hp, g, p, m, v, w, n);
	for (int r = 0; r < o.reps; r++) {
		if (r % 2 == 0) {
			t_triad[r] = run_triad(ta, tb, tc, nt);
			t_stream[r] = run_stream30(g, p, m, v, w, n);
			hp.step = step++;
			t_adam[r] = run_adam(&hp, &bufs, n);
			hp.step = step++;
			t_naive[r] = run_naive(&hp, g, p, m, v, w, n);
		} else {
			hp.step = step++;
			t_naive[r] = run_naive(&hp, g, p, m, v, w, n);
			hp.step = step++;
			t_adam[r] = run_adam(&hp, &bufs, n);
			t_stream[r] = run_stream30(g, p, m, v, w, n);
			t_triad[r] = run_triad(ta, tb, tc, nt);
		}
		/* achieved / triad and / stream30 within this rep, for the
		 * medians of ratios */
		r_triad[r] = ((double)n * bytes_per_param / t_adam[r]) / ((double)nt * 12.0 / t_triad[r]);
		r_stream[r] = t_stream[r] / t_adam[r];
	}
	med_triad = bench_median(t_triad, o.reps);
	med_adam = bench_median(t_adam, o.reps);
	med_naive = bench_median(t_naive, o.reps);
	ratio_med = bench_median(r_triad, o.reps);
	med_stream = bench_median(t_stream, o.reps);
	stream_ratio_med = bench_median(r_stream, o.reps);
	stream_gbps = (double)n * bytes_per_param / med_stream * 1e-9;
	stream_ratio = med_stream / med_adam;
	triad_gbps = (double)nt * 12.0 / med_triad * 1e-9;
	adam_gbps = (double)n * bytes_per_param / med_adam * 1e-9;
	naive_gbps = (double)n * bytes_per_param / med_naive * 1e-9;
	params_per_s = (double)n / med_adam;
	ratio = adam_gbps / triad_gbps;
	speedup = med_naive / med_adam;

	printf("adam-bench: %llu params, %d threads, path %s, %d reps (median), triad on %zu floats%s%s\n",
	       (unsigned long long)o.params, o.threads, st_optim_path_name(st_optim_path_get()),
	       o.reps, nt, o.state ? ", optim state " : "",
	       o.state ? st_optim_state_name((enum st_optim_state)o.state) : "");
	printf("  triad        %8.2f GB/s   (%.1f ms)\n", triad_gbps, med_triad * 1e3);
	printf("  stream30     %8.2f GB/s   (%.1f ms)  the same bytes, next to no arithmetic\n",
	       stream_gbps, med_stream * 1e3);
	printf("  adam fused   %8.2f GB/s   (%.1f ms)  %.3g params/s  %.1f B/param\n", adam_gbps,
	       med_adam * 1e3, params_per_s, bytes_per_param);
	printf("  adam naive   %8.2f GB/s   (%.1f ms)\n", naive_gbps, med_naive * 1e3);
	printf("  ratio achieved/triad %.3f (median of per-rep ratios %.3f), speedup vs naive %.2fx\n",
	       ratio, ratio_med, speedup);
	printf("  ratio achieved/stream30 %.3f (median of per-rep ratios %.3f)\n", stream_ratio,
	       stream_ratio_med);

	if (o.json) {
		json_object *j = json_object_new_object();

		json_object_object_add(j, "params", json_object_new_int64((int64_t)o.params));
		json_object_object_add(j, "params_per_s", json_object_new_double(params_per_s));
		json_object_object_add(j, "optim_state", json_object_new_string(
			st_optim_state_name((enum st_optim_state)o.state)));
		json_object_object_add(j, "bytes_per_param", json_object_new_double(bytes_per_param));
		json_object_object_add(j, "achieved_gbps", json_object_new_double(adam_gbps));
		json_object_object_add(j, "triad_gbps", json_object_new_double(triad_gbps));
		json_object_object_add(j, "ratio_to_triad", json_object_new_double(ratio));
		json_object_object_add(j, "ratio_to_triad_median_per_rep",
				       json_object_new_double(ratio_med));
		json_object_object_add(j, "stream30_gbps", json_object_new_double(stream_gbps));
		json_object_object_add(j, "ratio_to_stream30", json_object_new_double(stream_ratio));
		json_object_object_add(j, "ratio_to_stream30_median_per_rep",
				       json_object_new_double(stream_ratio_med));
		json_object_object_add(j, "naive_gbps", json_object_new_double(naive_gbps));
		json_object_object_add(j, "speedup_vs_naive", json_object_new_double(speedup));
		json_object_object_add(j, "path",
				       json_object_new_string(st_optim_path_name(st_optim_path_get())));
		json_object_object_add(j, "threads", json_object_new_int(o.threads));
		json_object_object_add(j, "reps", json_object_new_int(o.reps));
		/* written aside and renamed, so a failure leaves no partial file */
		if (bench_out_write("adam-bench", o.json,
				    json_object_to_json_string_ext(j, JSON_C_TO_STRING_PRETTY)) < 0) {
			json_object_put(j);
			exit(1); /* its buffers stay reachable, for LeakSanitizer */
		}
		json_object_put(j);
	}
	free(g);
	free(p);
	free(m);
	free(v);
	free(w);
	free(ta);
	free(tb);
	free(tc);
	free(t_triad);
	free(t_adam);
	free(t_naive);
	free(r_triad);
	free(t_stream);
	free(r_stream);
	return 0;
}
