/* gemm-split: whether an sgemm's bits depend on how its output is cut into
 * BLAS calls. For each shape, one single-threaded BLAS call over the whole
 * matmul against the same matmul cut in two along its rows, cut in two
 * along its columns, and as the cpu kernels run it (st_cpu_sgemm's tiles,
 * at 1 and at --threads threads); prints how many of the M*N elements
 * differ from the one call, bit for bit. The answer decides whether
 * st_cpu_sgemm may run one call per matmul (docs/model.md, "Kernels and
 * determinism"): with OpenBLAS 0.3.21 (Haswell kernel) it may not. */
#include "strata/kernels.h"

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
		"  --shapes S    gpt2 (default: the matmuls of gpt2's step at B=4 T=64),\n"
		"                or MxNxK[,MxNxK...] (C (M,N) = A (M,K) B (K,N), row-major)\n"
		"  --cut R       rows (columns) of the first part when cutting: a multiple\n"
		"                of R nearest the middle (default 64)\n"
		"  --threads N   threads for st_cpu_sgemm's second run (default 2)\n"
		"  --help        this text\n"
		"Prints, per shape, the elements that differ from one single-threaded\n"
		"BLAS call: cut in two rows-wise, column-wise, st_cpu_sgemm's tiles at 1\n"
		"thread, and st_cpu_sgemm at N threads against it at 1 (0: the tiles'\n"
		"bits do not depend on the thread count).\n");
}

struct shape {
	int m, n, k;
};

/* gpt2 small at B = 4, T = 64 (256 rows): the blocks' four matmuls forward,
 * their weight gradients, the head's three (V = 50257), all as A B. */
static const struct shape gpt2_shapes[] = {
	{ 256, 2304, 768 }, { 256, 768, 768 },  { 256, 3072, 768 },  { 256, 768, 3072 },
	{ 768, 2304, 256 }, { 3072, 768, 256 }, { 256, 50257, 768 }, { 256, 768, 50257 },
	{ 50257, 768, 256 },
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

static void call(int m, int n, int k, const float *a, int lda, const float *b, int ldb,
		 float *c, int ldc)
{
	if (m > 0 && n > 0)
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, lda, b,
			    ldb, 0.0f, c, ldc);
}

static int cut_at(int dim, int cut)
{
	int c = (dim / 2 + cut / 2) / cut * cut;

	return c < dim ? c : dim - dim / 2;
}

/* One shape: 0, or -1 out of memory. */
static int run_shape(const struct shape *s, int cut, int threads)
{
	const int M = s->m, N = s->n, K = s->k;
	const size_t mn = (size_t)M * N;
	float *A = rand_buf((size_t)M * K), *B = rand_buf((size_t)K * N);
	float *one = malloc(mn * sizeof(float)), *got = malloc(mn * sizeof(float));
	float *tiles1 = malloc(mn * sizeof(float));
	int ret = -1;

	if (!A || !B || !one || !got || !tiles1)
		goto out;
	omp_set_num_threads(1);
	call(M, N, K, A, K, B, N, one, N);
	int r = cut_at(M, cut), c = cut_at(N, cut);
	call(r, N, K, A, K, B, N, got, N);
	call(M - r, N, K, A + (size_t)r * K, K, B, N, got + (size_t)r * N, N);
	size_t d_rows = differ(one, got, mn);
	call(M, c, K, A, K, B, N, got, N);
	call(M, N - c, K, A, K, B + c, N, got + c, N);
	size_t d_cols = differ(one, got, mn);
	st_cpu_sgemm(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, tiles1, N);
	size_t d_tiles = differ(one, tiles1, mn);
	omp_set_num_threads(threads);
	st_cpu_sgemm(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, got, N);
	size_t d_threads = differ(tiles1, got, mn);
	printf("%6d x %6d x %6d  rows cut at %6d: %9zu  columns cut at %6d: %9zu  "
	       "tiles: %9zu  tiles at %d threads vs 1: %zu  (of %zu)\n",
	       M, N, K, r, d_rows, c, d_cols, d_tiles, threads, d_threads, mn);
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

static int parse_int(const char *s, int lo, int hi, int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -1;
	*out = (int)v;
	return 0;
}

int main(int argc, char **argv)
{
	const char *shapes = "gpt2";
	int cut = 64, threads = 2;
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
			if (parse_int(v, 1, 1 << 20, &cut)) {
				fprintf(stderr, "gemm-split: --cut '%s' is not an integer in 1..1048576\n", v);
				return 2;
			}
		} else if (!strcmp(a, "--threads")) {
			if (parse_int(v, 1, 1024, &threads)) {
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
			int m, nn, k, used = 0;

			if (n == 64 || sscanf(p, "%dx%dx%d%n", &m, &nn, &k, &used) != 3 || m < 1 ||
			    nn < 1 || k < 1 || m > 1 << 20 || nn > 1 << 20 || k > 1 << 20 ||
			    (p[used] && p[used] != ',')) {
				fprintf(stderr, "gemm-split: --shapes '%s': want gpt2 or MxNxK[,...] "
						"(at most 64, each 1..1048576)\n", shapes);
				return 2;
			}
			list[n++] = (struct shape){ m, nn, k };
			p += used + (p[used] == ',');
		}
	}
	printf("one single-threaded cblas_sgemm (NoTrans, NoTrans, alpha 1, beta 0) against "
	       "the same matmul cut in two, and against st_cpu_sgemm; elements that differ:\n");
	for (int i = 0; i < n; i++) {
		if (run_shape(&list[i], cut, threads)) {
			fprintf(stderr, "gemm-split: out of memory at %dx%dx%d\n", list[i].m,
				list[i].n, list[i].k);
			return 1;
		}
	}
	return 0;
}
