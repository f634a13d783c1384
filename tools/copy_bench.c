/* copy-bench: the device's h2d and d2h copy rate by size, through its
 * queues, from pinned host memory: on cuda the pinned-copy ceiling the
 * engine's W h2d and dW d2h can reach (issue 22); on cpu a memcpy run by
 * the device's copy threads, the same path the engine's copies take.
 *
 * For each size, reps copies are queued back to back on one queue and
 * timed from the first queued to the queue drained (so the rate includes
 * what the queue costs per copy); rounds of that alternate h2d and d2h
 * and the median of the rounds is printed. */
#include "strata/device.h"

#include "bench_out.h"
#include "bench_stats.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SIZES 32
#define MAX_ROUNDS 1000

static void usage(FILE *f)
{
	fprintf(f,
		"usage: copy-bench [--device cpu|cuda] [--sizes S,S,..] [--rounds N] [--reps N]\n"
		"                  [--json FILE]\n"
		"  the device's h2d and d2h copy rate (GB/s) by size, from pinned host\n"
		"  memory through one of its queues: reps copies queued back to back,\n"
		"  timed to the queue drained, h2d and d2h in turn, median of rounds.\n"
		"  cuda: the pinned-copy ceiling; cpu: memcpy on the device's copy thread.\n"
		"  --device     (default cpu)\n"
		"  --sizes      (default 64K,1M,16M,64M; K, M, G suffixes)\n"
		"  --rounds N   (default 5)     --reps N (default 4)\n"
		"  --json FILE  the medians as JSON\n"
		"  Exit 77 when the device cannot be opened (no GPU), 2 on bad input.\n");
}

/* The seconds of reps copies of bytes in direction dir on q. */
static int time_copies(struct st_device *d, struct st_queue *q, void *dev, void *host,
		       size_t bytes, enum st_copy_dir dir, int reps, double *secs)
{
	uint64_t t0 = st_now_ns();
	int ret = 0;

	for (int i = 0; i < reps && ret == 0; i++)
		ret = dir == ST_COPY_H2D ? st_device_memcpy_async(d, q, dev, host, bytes, dir)
					 : st_device_memcpy_async(d, q, host, dev, bytes, dir);
	if (ret == 0)
		ret = st_queue_sync(d, q);
	*secs = (double)(st_now_ns() - t0) / 1e9;
	return ret;
}

static int parse_sizes(const char *text, uint64_t *sizes, int *n)
{
	char buf[512], *save = NULL;

	if (strlen(text) >= sizeof(buf))
		return -EINVAL;
	strcpy(buf, text);
	*n = 0;
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (*n == MAX_SIZES || st_parse_size(t, &sizes[*n]) < 0 || sizes[*n] == 0)
			return -EINVAL;
		(*n)++;
	}
	return *n ? 0 : -EINVAL;
}

int main(int argc, char **argv)
{
	const char *devname = "cpu", *json = NULL, *sizes_text = "64K,1M,16M,64M";
	uint64_t sizes[MAX_SIZES], max_bytes = 0;
	int nsizes = 0, rounds = 5, reps = 4;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			return 0;
		}
		if (i + 1 >= argc || (strcmp(a, "--device") && strcmp(a, "--sizes") &&
				      strcmp(a, "--rounds") && strcmp(a, "--reps") &&
				      strcmp(a, "--json"))) {
			fprintf(stderr, "copy-bench: unknown argument %s (see --help)\n", a);
			return 2;
		}
		const char *v = argv[++i];

		if (!strcmp(a, "--device")) {
			devname = v;
		} else if (!strcmp(a, "--sizes")) {
			sizes_text = v;
		} else if (!strcmp(a, "--json")) {
			json = v;
		} else if (bench_parse_int(v, 1, MAX_ROUNDS, !strcmp(a, "--rounds") ? &rounds : &reps) < 0) {
			fprintf(stderr, "copy-bench: %s %s: a count from 1 to %d\n", a, v, MAX_ROUNDS);
			return 2;
		}
	}
	if (parse_sizes(sizes_text, sizes, &nsizes) < 0) {
		fprintf(stderr, "copy-bench: --sizes %s: sizes like 64K,1M (at most %d)\n",
			sizes_text, MAX_SIZES);
		return 2;
	}
	const struct st_device_ops *ops = st_device_find(devname);

	if (!ops) {
		fprintf(stderr, "copy-bench: --device %s: not one of %s\n", devname,
			st_device_list());
		return 2;
	}
	if (json)
		bench_out_check("copy-bench", "--json", json);
	for (int i = 0; i < nsizes; i++)
		max_bytes = ST_MAX(max_bytes, sizes[i]);

	/* the arena holds one copy of the largest size, page-aligned */
	struct st_device_config cfg = { .mem_bytes = st_align_up(max_bytes, 1u << 21) };
	struct st_device *d = NULL;
	int ret = st_device_create(ops, &cfg, &d);

	if (ret == -ENODEV) {
		printf("copy-bench: no %s device here: skipped (%s)\n", devname, st_error_last());
		return 77;
	}
	if (ret < 0) {
		fprintf(stderr, "copy-bench: %s device: %s\n", devname, st_error_last());
		return 1;
	}
	void *dev = st_device_arena(d, NULL), *host = NULL;
	struct st_queue *q = NULL;
	FILE *jf = NULL;
	char *jtext = NULL;
	size_t jlen = 0;

	if (posix_memalign(&host, 1u << 21, (size_t)st_align_up(max_bytes, 1u << 21))) {
		fprintf(stderr, "copy-bench: host buffer of %llu bytes: out of memory\n",
			(unsigned long long)max_bytes);
		st_device_destroy(d);
		return 1;
	}
	memset(host, 1, (size_t)max_bytes);
	ret = st_device_pin_host(d, host, (size_t)st_align_up(max_bytes, 1u << 21));
	if (ret == 0)
		ret = st_queue_create(d, &q);
	if (ret < 0) {
		fprintf(stderr, "copy-bench: %s\n", st_error_last());
		goto out;
	}
	/* the JSON in memory, written to the file at the end */
	if (json && !(jf = open_memstream(&jtext, &jlen))) {
		ret = -errno;
		fprintf(stderr, "copy-bench: %s: %s\n", json, strerror(errno));
		goto out;
	}
	printf("copy-bench: %s device, host memory %s, %d rounds x %d copies per size\n", devname,
	       st_device_can_pin(d) ? "pinned" : "as allocated (the device pins nothing)", rounds,
	       reps);
	printf("%12s %12s %12s\n", "bytes", "h2d GB/s", "d2h GB/s");
	if (jf)
		fprintf(jf, "{\"device\":\"%s\",\"pinned\":%s,\"rounds\":%d,\"reps\":%d,\"sizes\":[",
			devname, st_device_can_pin(d) ? "true" : "false", rounds, reps);
	for (int s = 0; s < nsizes && ret == 0; s++) {
		double rate[2][MAX_ROUNDS], med[2];
		double secs = 0;

		/* a warm-up of each direction: first-touch of the arena, the
		 * copy thread's or the driver's first call */
		ret = time_copies(d, q, dev, host, (size_t)sizes[s], ST_COPY_H2D, 1, &secs);
		if (ret == 0)
			ret = time_copies(d, q, dev, host, (size_t)sizes[s], ST_COPY_D2H, 1, &secs);
		for (int r = 0; r < rounds && ret == 0; r++)
			for (int k = 0; k < 2 && ret == 0; k++) {
				/* the direction that goes first alternates by round */
				int dir = (k + r) % 2;

				ret = time_copies(d, q, dev, host, (size_t)sizes[s],
						  dir ? ST_COPY_D2H : ST_COPY_H2D, reps, &secs);
				rate[dir][r] = (double)sizes[s] * reps / secs / 1e9;
			}
		if (ret < 0)
			break;
		med[0] = bench_median(rate[0], rounds);
		med[1] = bench_median(rate[1], rounds);
		printf("%12llu %12.2f %12.2f\n", (unsigned long long)sizes[s], med[0], med[1]);
		if (jf)
			fprintf(jf, "%s{\"bytes\":%llu,\"h2d_gbps\":%.4f,\"d2h_gbps\":%.4f}",
				s ? "," : "", (unsigned long long)sizes[s], med[0], med[1]);
	}
	if (ret < 0)
		fprintf(stderr, "copy-bench: a copy failed: %s\n", st_error_last());
	if (jf) {
		fputs("]}\n", jf);
		if (fclose(jf) != 0 && ret == 0) {
			ret = -errno;
			fprintf(stderr, "copy-bench: %s: %s\n", json, strerror(errno));
		}
		if (ret == 0 && bench_out_write("copy-bench", json, jtext) < 0)
			ret = -EIO;
		free(jtext);
	}
out:
	if (q)
		st_queue_destroy(d, q);
	st_device_unpin_host(d, host);
	st_device_destroy(d);
	free(host);
	return ret < 0 ? 1 : 0;
}
