/* tok-bench-c: how fast strata's tokenizer encodes, on one core.
 *
 *   tok-bench-c --tokenizer DIR [--passes N] FILE...
 *
 * Loads the tokenizer (not timed), reads the FILEs into memory, then times N
 * passes of st_tokenizer_encode over them (each file one document, no
 * specials), the first pass with an empty word cache as `strata tokenize`
 * starts. Prints one JSON line: bytes, ids, passes, the first pass's MB/s
 * of wall time (mb_s) and of this thread's CPU time (cpu_mb_s), and the
 * median over all passes (mb_s_median). tools/tok-bench runs it
 * interleaved with the JavaScript reference (tools/tok-ref bench). */
#include "strata/tokenizer.h"
#include "bench_stats.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* CPU time of this thread: what one core spent, whatever else the
 * machine runs */
static double cpu_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	const char *dir = NULL;
	int passes = 1, nf = 0;
	/* the bad-input exits below are exit(2), not return: these stay
	 * reachable, which LeakSanitizer holds a return from main to */
	char **text = calloc((size_t)argc, sizeof(*text));
	size_t *len = calloc((size_t)argc, sizeof(*len)), bytes = 0, ids_n = 0;
	struct st_tokenizer *t;
	struct st_tok_ids ids = { 0 };
	double *rate, cpu_rate = 0;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			printf("usage: tok-bench-c --tokenizer DIR [--passes N] FILE...\n"
			       "Encoding speed of strata's tokenizer on one core, as one JSON line.\n");
			exit(0);
		}
		if (strcmp(argv[i], "--tokenizer") == 0 && i + 1 < argc) {
			dir = argv[++i];
		} else if (strcmp(argv[i], "--passes") == 0 && i + 1 < argc) {
			if (bench_parse_int(argv[++i], 1, INT_MAX, &passes)) {
				fprintf(stderr, "tok-bench-c: bad --passes %s (a whole number, 1 or more)\n",
					argv[i]);
				exit(2);
			}
		} else if (argv[i][0] == '-') {
			fprintf(stderr, "tok-bench-c: unknown option %s\n", argv[i]);
			exit(2);
		} else {
			FILE *f = fopen(argv[i], "rb");
			struct stat sb;
			long n;

			if (f && fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
				fclose(f);
				f = NULL;
				errno = EISDIR;
			}
			if (!f || fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0) {
				fprintf(stderr, "tok-bench-c: %s: cannot read (%s)\n", argv[i],
					strerror(errno));
				exit(2);
			}
			rewind(f);
			errno = 0;
			text[nf] = malloc((size_t)n + 1);
			if (!text[nf] || fread(text[nf], 1, (size_t)n, f) != (size_t)n) {
				fprintf(stderr, "tok-bench-c: %s: cannot read (%s)\n", argv[i],
					strerror(errno ? errno : EIO));
				exit(2);
			}
			fclose(f);
			len[nf++] = (size_t)n;
			bytes += (size_t)n;
		}
	}
	if (!dir || !nf) {
		fprintf(stderr, "tok-bench-c: --tokenizer DIR and a FILE are required\n");
		exit(2);
	}
	if (st_tokenizer_open(dir, &t) < 0) {
		fprintf(stderr, "tok-bench-c: %s\n", st_error_last());
		exit(2);
	}
	rate = calloc((size_t)passes, sizeof(*rate));
	for (int p = 0; p < passes; p++) {
		uint64_t t0 = st_now_ns();
		double c0 = cpu_s();

		ids_n = 0;
		for (int i = 0; i < nf; i++) {
			ids.n = 0;
			if (st_tokenizer_encode(t, text[i], len[i], 0, &ids) < 0) {
				fprintf(stderr, "tok-bench-c: %s\n", st_error_last());
				return 1;
			}
			ids_n += ids.n;
		}
		rate[p] = (double)bytes / ((double)(st_now_ns() - t0) / 1e9) / 1e6;
		if (p == 0)
			cpu_rate = (double)bytes / (cpu_s() - c0) / 1e6;
	}
	printf("{\"bytes\": %zu, \"ids\": %zu, \"passes\": %d, \"mb_s\": %.3f, "
	       "\"cpu_mb_s\": %.3f", bytes, ids_n, passes, rate[0], cpu_rate);
	qsort(rate, (size_t)passes, sizeof(*rate), bench_cmp_double);
	printf(", \"mb_s_median\": %.3f}\n", rate[passes / 2]);
	st_tok_ids_fini(&ids);
	st_tokenizer_close(t);
	return 0;
}
