/* gemm-split: whether an sgemm's bits depend on how its output is cut into
 * BLAS calls, and what the cut costs. For each shape (and layout: the step
 * runs its matmuls as A B, A B^T and A^T B), one single-threaded BLAS call
 * over the whole matmul against the same matmul cut in two along its rows,
 * cut in two along its columns, and as the cpu kernels run it
 * (st_cpu_sgemm's tiles, at 1 and at --threads threads); prints how many of
 * the M*N elements differ from the one call, bit for bit. The answer decides
 * whether st_cpu_sgemm may run one call per matmul (docs/model.md, "Kernels
 * and determinism"): with OpenBLAS 0.3.21's Haswell kernel it may not.
 * --time R also times, at one thread, the one call against the tiles (the
 * best of R runs each, alternated): the tiles pack their slices again; and
 * both, summed over the step's calls, against a 2048^3 sgemm's rate: the
 * matmuls' own ceiling for train-bench's model/sgemm ratio. */
#include "strata/common.h"
#include "strata/kernels.h"
#include "bench_stats.h"

#include <cblas.h>
#include <errno.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
	fprintf(f,
		"usage: gemm-split [options]\n"
		"  --shapes S    gpt2 (default: the matmuls of gpt2's step at B=4 T=64,\n"
		"                each in its layout), or [nn:|nt:|tn:]MxNxK[,...]: C (M,N) =\n"
		"                A (M,K) B (K,N), row-major; nt: B stored (N,K), tn: A (K,M)\n"
		"  --cut R       rows (columns) of the first part when cutting: a multiple\n"
		"                of R nearest the middle (default 64)\n"
		"  --threads N   threads for st_cpu_sgemm's second run (default 2)\n"
		"  --time R      also time one call against the tiles at one thread,\n"
		"                the best of R runs each, alternated (default 0: no)\n"
		"  --help        this text\n"
		"Prints, per shape, the elements that differ from one single-threaded\n"
		"BLAS call: cut in two rows-wise, column-wise, st_cpu_sgemm's tiles at 1\n"
		"thread, and st_cpu_sgemm at N threads against it at 1 (0: the tiles'\n"
		"bits do not depend on the thread count), and the tile it cuts into.\n");
}

struct shape {
	int ta, tb; /* st_cpu_sgemm's trans_a, trans_b */
	int m, n, k;
	int count;  /* calls a step makes (for --time's totals) */
};

/* gpt2 small at B = 4, T = 64 (256 rows), as st_cpu_matmul_fwd/bwd and the
 * head call st_cpu_sgemm: each block's four matmuls forward (A B), their
 * input gradients (A B^T) and weight gradients (A^T B), 12 of each; the
 * tied head's three (V = 50257): logits (A B^T), its input gradient (A B),
 * its weight gradient (A^T B). */
static const struct shape gpt2_shapes[] = {
	{ 0, 0, 256, 2304, 768, 12 },  { 0, 0, 256, 768, 768, 12 },
	{ 0, 0, 256, 3072, 768, 12 },  { 0, 0, 256, 768, 3072, 12 },
	{ 0, 1, 256, 768, 2304, 12 },  { 0, 1, 256, 768, 768, 12 },
	{ 0, 1, 256, 768, 3072, 12 },  { 0, 1, 256, 3072, 768, 12 },
	{ 1, 0, 768, 2304, 256, 12 },  { 1, 0, 768, 768, 256, 12 },
	{ 1, 0, 768, 3072, 256, 12 },  { 1, 0, 3072, 768, 256, 12 },
	{ 0, 1, 256, 50257, 768, 1 },  { 0, 0, 256, 768, 50257, 1 },
	{ 1, 0, 50257, 768, 256, 1 },
};

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float *rand_buf(size_t n)
{
	float *p = malloc(n * sizeof(float));

	if (!p)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		p[i] = (float)((double)(rng >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
	}
	return p;
}

static size_t differ(const float *a, const float *b, size_t n)
{
	size_t d = 0;

	for (size_t i = 0; i < n; i++)
		d += memcmp(a + i, b + i, sizeof(float)) != 0;
	return d;
}

struct mats {
	const struct shape *s;
	const float *A, *B;
	int lda, ldb;
};

/* Rows i0.. (m of them) and columns j0.. (n) of C as one BLAS call. */
static void call(const struct mats *x, int i0, int m, int j0, int n, float *C, int ldc)
{
	const float *a = x->s->ta ? x->A + i0 : x->A + (size_t)i0 * x->lda;
	const float *b = x->s->tb ? x->B + (size_t)j0 * x->ldb : x->B + j0;

	if (m > 0 && n > 0)
		cblas_sgemm(CblasRowMajor, x->s->ta ? CblasTrans : CblasNoTrans,
			    x->s->tb ? CblasTrans : CblasNoTrans, m, n, x->s->k, 1.0f, a, x->lda,
			    b, x->ldb, 0.0f, C + (size_t)i0 * ldc + j0, ldc);
}

static double now_s(void)
{
	return (double)st_now_ns() * 1e-9;
}

static int cut_at(int dim, int cut)
{
	int c = (dim / 2 + cut / 2) / cut * cut;

	return c < dim ? c : dim - dim / 2;
}

/* One shape: 0, or -1 out of memory. With reps > 0 it adds the step's
 * seconds for the shape (count calls) to t_one and t_tiles. */
static int run_shape(const struct shape *s, int cut, int threads, int reps, double *t_one,
		     double *t_tiles)
{
	const int M = s->m, N = s->n, K = s->k;
	const size_t mn = (size_t)M * N;
	float *A = rand_buf((size_t)M * K), *B = rand_buf((size_t)K * N);
	float *one = malloc(mn * sizeof(float)), *got = malloc(mn * sizeof(float));
	float *tiles1 = malloc(mn * sizeof(float));
	struct mats x = { s, A, B, s->ta ? M : K, s->tb ? K : N };
	int ret = -1, tm, tn;

	if (!A || !B || !one || !got || !tiles1)
		goto out;
	omp_set_num_threads(1);
	call(&x, 0, M, 0, N, one, N);
	int r = cut_at(M, cut), c = cut_at(N, cut);
	call(&x, 0, r, 0, N, got, N);
	call(&x, r, M - r, 0, N, got, N);
	size_t d_rows = differ(one, got, mn);
	call(&x, 0, M, 0, c, got, N);
	call(&x, 0, M, c, N - c, got, N);
	size_t d_cols = differ(one, got, mn);
	st_cpu_sgemm(s->ta, s->tb, M, N, K, 1.0f, A, x.lda, B, x.ldb, 0.0f, tiles1, N);
	size_t d_tiles = differ(one, tiles1, mn);
	omp_set_num_threads(threads);
	st_cpu_sgemm(s->ta, s->tb, M, N, K, 1.0f, A, x.lda, B, x.ldb, 0.0f, got, N);
	size_t d_threads = differ(tiles1, got, mn);
	st_cpu_gemm_tiles(M, N, &tm, &tn);
	printf("%s %6d x %6d x %6d  rows cut at %6d: %9zu  columns cut at %6d: %9zu  "
	       "tiles %dx%d: %9zu  tiles at %d threads vs 1: %zu  (of %zu)",
	       s->ta ? "tn" : s->tb ? "nt" : "nn", M, N, K, r, d_rows, c, d_cols, tm, tn,
	       d_tiles, threads, d_threads, mn);
	if (reps > 0) {
		double best_one = 0, best_tiles = 0;

		omp_set_num_threads(1);
		for (int i = 0; i < 2 * reps; i++) {
			double t0 = now_s();
			if (i % 2 == 0)
				call(&x, 0, M, 0, N, one, N);
			else
				st_cpu_sgemm(s->ta, s->tb, M, N, K, 1.0f, A, x.lda, B, x.ldb, 0.0f,
					     got, N);
			double t = now_s() - t0;
			double *best = i % 2 == 0 ? &best_one : &best_tiles;
			if (i < 2 || t < *best)
				*best = t;
		}
		printf("  one call %.2f ms, tiles %.2f ms (%.3f)", 1e3 * best_one,
		       1e3 * best_tiles, best_tiles / best_one);
		*t_one += best_one * s->count;
		*t_tiles += best_tiles * s->count;
	}
	printf("\n");
	fflush(stdout);
	ret = 0;
out:
	free(A);
	free(B);
	free(one);
	free(got);
	free(tiles1);
	return ret;
}

int main(int argc, char **argv)
{
	const char *shapes = "gpt2";
	int cut = 64, threads = 2, reps = 0;
	struct shape list[64];
	int n = 0;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			return 0;
		}
		if (i + 1 >= argc) {
			fprintf(stderr, "gemm-split: unknown option or missing value '%s' (see --help)\n", a);
			return 2;
		}
		const char *v = argv[++i];
		if (!strcmp(a, "--shapes")) {
			shapes = v;
		} else if (!strcmp(a, "--cut")) {
			if (bench_parse_int(v, 1, 1 << 20, &cut)) {
				fprintf(stderr, "gemm-split: --cut '%s' is not an integer in 1..1048576\n", v);
				return 2;
			}
		} else if (!strcmp(a, "--time")) {
			if (bench_parse_int(v, 0, 1000, &reps)) {
				fprintf(stderr, "gemm-split: --time '%s' is not an integer in 0..1000\n", v);
				return 2;
			}
		} else if (!strcmp(a, "--threads")) {
			if (bench_parse_int(v, 1, 1024, &threads)) {
				fprintf(stderr, "gemm-split: --threads '%s' is not an integer in 1..1024\n", v);
				return 2;
			}
		} else {
			fprintf(stderr, "gemm-split: unknown option '%s' (see --help)\n", a);
			return 2;
		}
	}
	if (!strcmp(shapes, "gpt2")) {
		n = (int)(sizeof(gpt2_shapes) / sizeof(gpt2_shapes[0]));
		memcpy(list, gpt2_shapes, sizeof(gpt2_shapes));
	} else {
		const char *p = shapes;

		while (*p) {
			int m, nn, k, used = 0, ta = 0, tb = 0;

			if (!strncmp(p, "nn:", 3) || !strncmp(p, "nt:", 3) || !strncmp(p, "tn:", 3)) {
				ta = p[0] == 't';
				tb = p[1] == 't';
				p += 3;
			}
			if (n == 64 || sscanf(p, "%dx%dx%d%n", &m, &nn, &k, &used) != 3 || m < 1 ||
			    nn < 1 || k < 1 || m > 1 << 20 || nn > 1 << 20 || k > 1 << 20 ||
			    (p[used] && p[used] != ',')) {
				fprintf(stderr, "gemm-split: --shapes '%s': want gpt2 or "
						"[nn:|nt:|tn:]MxNxK[,...] (at most 64, each 1..1048576)\n",
					shapes);
				return 2;
			}
			list[n++] = (struct shape){ ta, tb, m, nn, k, 1 };
			p += used + (p[used] == ',');
		}
	}
	printf("one single-threaded cblas_sgemm (alpha 1, beta 0; nn: A B, nt: A B^T, tn: A^T B) "
	       "against the same matmul cut in two, and against st_cpu_sgemm; elements that "
	       "differ:\n");
	double t_one = 0, t_tiles = 0;
	for (int i = 0; i < n; i++) {
		if (run_shape(&list[i], cut, threads, reps, &t_one, &t_tiles)) {
			fprintf(stderr, "gemm-split: out of memory at %dx%dx%d\n", list[i].m,
				list[i].n, list[i].k);
			return 1;
		}
	}
	if (reps > 0) {
		double flop = 0, t_big = 0;
		const int S = 2048;
		float *A = rand_buf((size_t)S * S), *B = rand_buf((size_t)S * S);
		float *C = malloc((size_t)S * S * sizeof(float));

		if (!A || !B || !C) {
			fprintf(stderr, "gemm-split: out of memory for the %d^3 sgemm\n", S);
			return 1;
		}
		for (int i = 0; i < n; i++)
			flop += 2.0 * list[i].m * list[i].n * list[i].k * list[i].count;
		omp_set_num_threads(1);
		for (int i = 0; i < reps; i++) {
			double t0 = now_s();
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, S, S, S, 1.0f, A, S, B,
				    S, 0.0f, C, S);
			double t = now_s() - t0;
			if (i == 0 || t < t_big)
				t_big = t;
		}
		double big = 2.0 * S * S * S / t_big;
		printf("all %s (each shape times the calls a step makes, %.3g FLOP): one call "
		       "%.3f s, tiles %.3f s, tiles / one call %.3f\n"
		       "against the %d^3 sgemm at one thread (%.1f GFLOP/s): one call per matmul "
		       "%.3f of its rate, the tiles %.3f\n",
		       strcmp(shapes, "gpt2") ? "shapes" : "of gpt2's step", flop, t_one, t_tiles,
		       t_tiles / t_one, S, big / 1e9, flop / t_one / big, flop / t_tiles / big);
		free(A);
		free(B);
		free(C);
	}
	return 0;
}
