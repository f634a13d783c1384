/* nvme-bench: what can these drives give strata?
 *
 * Sweeps block size x queue depth x direction over swap files made by the
 * same nvme tier the trainer uses (io_uring, O_DIRECT, fixed files, fixed
 * buffers from a pinned host tier), and prints GB/s, IOPS, latency
 * percentiles and CPU use per point, then the --aio-block / --aio-depth to
 * train with. Access is sequential over the file, wrapping around, with qd
 * requests of bs bytes kept in flight (fio's rw=read/write, iodepth=qd).
 * The files are unlinked as soon as they are open: Ctrl-C, or a crash,
 * leaves nothing behind. */
#include "strata/tier.h"
#include "bench_out.h"

#include <errno.h>
#include <getopt.h>
#include <json-c/json.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define MAX_LIST 16

struct opts {
	const char *dirs;
	uint64_t size_bytes;
	uint64_t bs[MAX_LIST];
	unsigned nbs;
	unsigned qd[MAX_LIST];
	unsigned nqd;
	int rw[2]; /* ST_IO_READ / ST_IO_WRITE in the order given */
	unsigned nrw;
	double time_s;
	const char *json;
	bool buffered;
	bool quiet;
};

struct point {
	int rw;
	uint64_t bs;
	unsigned qd;
	double gbps, iops, p50_us, p99_us, cpu_pct;
};

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
	(void)sig;
	interrupted = 1;
}

static void usage(FILE *f)
{
	fprintf(f,
"usage: nvme-bench --dir DIR[,DIR...] [options]\n"
"\n"
"Measure the sequential read and write speed strata's nvme tier gets from\n"
"the drives behind DIR (several directories are striped round-robin by\n"
"block, as in training), and recommend --aio-block and --aio-depth.\n"
"\n"
"  --dir DIR[,DIR...]   directories on the drives to test (required)\n"
"  --size SIZE          bytes of swap file in all (default 4G)\n"
"  --bs LIST            block sizes (default 128K,1M,4M)\n"
"  --qd LIST            queue depths (default 1,8,32)\n"
"  --rw LIST            read,write (default both)\n"
"  --time SECONDS       seconds per point (default 3)\n"
"  --json FILE          also write the results as JSON\n"
"  --buffered           go through the page cache (no O_DIRECT)\n"
"  --quiet              no progress lines\n"
"  -h, --help           this help\n"
"\n"
"GB/s is 10^9 bytes per second; latency is from submit to completion;\n"
"CPU is the process's user+system time over wall time (100%% = one core).\n"
"Exit status: 0 done, 1 I/O failure, 2 bad input, 130 interrupted.\n");
}

static void die_usage(const char *fmt, const char *arg)
{
	fputs("nvme-bench: ", stderr);
	fprintf(stderr, fmt, arg);
	fputs(" (see --help)\n", stderr);
	exit(2);
}

static unsigned parse_list(const char *text, const char *what, uint64_t *out, bool size)
{
	char *copy = strdup(text), *save = NULL, *tok;
	unsigned n = 0;

	char msg[256];

	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		uint64_t v;

		if (n == MAX_LIST)
			die_usage("too many values in %s", what);
		if (size) {
			snprintf(msg, sizeof(msg), "%s: %s is not a size", what, tok);
			if (st_parse_size(tok, &v) < 0)
				die_usage("%s", msg);
		} else {
			char *end;

			snprintf(msg, sizeof(msg), "%s: %s is not a whole number", what, tok);
			errno = 0;
			v = strtoull(tok, &end, 10);
			if (errno || *end || end == tok || tok[0] == '-')
				die_usage("%s", msg);
		}
		out[n++] = v;
	}
	free(copy);
	if (n == 0)
		die_usage("%s needs at least one value", what);
	return n;
}

static void parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option longs[] = {
		{ "dir", required_argument, NULL, 'd' },
		{ "size", required_argument, NULL, 's' },
		{ "bs", required_argument, NULL, 'b' },
		{ "qd", required_argument, NULL, 'q' },
		{ "rw", required_argument, NULL, 'r' },
		{ "time", required_argument, NULL, 't' },
		{ "json", required_argument, NULL, 'j' },
		{ "buffered", no_argument, NULL, 'B' },
		{ "quiet", no_argument, NULL, 'Q' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	uint64_t tmp[MAX_LIST];
	int c;

	*o = (struct opts){ .size_bytes = 4 * ST_GiB, .time_s = 3.0 };
	o->nbs = parse_list("128K,1M,4M", "--bs", o->bs, true);
	o->nqd = parse_list("1,8,32", "--qd", tmp, false);
	for (unsigned i = 0; i < o->nqd; i++)
		o->qd[i] = (unsigned)tmp[i];
	o->rw[0] = ST_IO_READ;
	o->rw[1] = ST_IO_WRITE;
	o->nrw = 2;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		switch (c) {
		case 'd':
			o->dirs = optarg;
			break;
		case 's':
			if (st_parse_size(optarg, &o->size_bytes) < 0 || o->size_bytes == 0)
				die_usage("--size %s is not a size", optarg);
			break;
		case 'b':
			o->nbs = parse_list(optarg, "--bs", o->bs, true);
			break;
		case 'q':
			o->nqd = parse_list(optarg, "--qd", tmp, false);
			for (unsigned i = 0; i < o->nqd; i++) {
				if (tmp[i] == 0 || tmp[i] > 1024)
					die_usage("--qd %s: each depth must be 1 to 1024", optarg);
				o->qd[i] = (unsigned)tmp[i];
			}
			break;
		case 'r': {
			char *copy = strdup(optarg), *save = NULL, *tok;

			o->nrw = 0;
			for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
				if (o->nrw == 2)
					die_usage("--rw %s: read and write, once each", optarg);
				if (strcmp(tok, "read") == 0)
					o->rw[o->nrw++] = ST_IO_READ;
				else if (strcmp(tok, "write") == 0)
					o->rw[o->nrw++] = ST_IO_WRITE;
				else
					die_usage("--rw: %s is neither read nor write", tok);
			}
			free(copy);
			if (o->nrw == 0 || (o->nrw == 2 && o->rw[0] == o->rw[1]))
				die_usage("--rw %s: read and write, once each", optarg);
			break;
		}
		case 't': {
			char *end;

			o->time_s = strtod(optarg, &end);
			if (*end || end == optarg || !(o->time_s > 0) || o->time_s > 3600)
				die_usage("--time %s: seconds must be more than 0 and at most 3600",
					  optarg);
			break;
		}
		case 'j':
			o->json = optarg;
			break;
		case 'B':
			o->buffered = true;
			break;
		case 'Q':
			o->quiet = true;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			die_usage("unknown or incomplete option %s", argv[optind - 1]);
		}
	}
	if (optind < argc)
		die_usage("unexpected argument %s", argv[optind]);
	if (!o->dirs)
		die_usage("%s", "--dir is required");
	for (unsigned i = 0; i < o->nbs; i++) {
		char b[32];

		snprintf(b, sizeof(b), "%llu", (unsigned long long)o->bs[i]);
		if (!st_is_pow2(o->bs[i]) || o->bs[i] < 4096 || o->bs[i] > 64 * ST_MiB)
			die_usage("--bs %s: each block size must be a power of two from 4K to 64M", b);
		if (o->bs[i] > o->size_bytes)
			die_usage("--bs %s is larger than --size", b);
	}
}

/* Every directory exists, and together they have room for the files. */
static void check_dirs(const struct opts *o)
{
	char *copy = strdup(o->dirs), *save = NULL, *tok;
	unsigned n = 0;

	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
		n++;
	strcpy(copy, o->dirs);
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		struct stat st;
		struct statvfs vfs;
		uint64_t need = o->size_bytes / n + 64 * ST_MiB, have;
		char a[32], b[32];

		if (stat(tok, &st) < 0) {
			fprintf(stderr, "nvme-bench: --dir %s: %s\n", tok, strerror(errno));
			exit(2);
		}
		if (!S_ISDIR(st.st_mode)) {
			fprintf(stderr, "nvme-bench: --dir %s: not a directory\n", tok);
			exit(2);
		}
		if (access(tok, W_OK) < 0) {
			fprintf(stderr, "nvme-bench: --dir %s: %s\n", tok, strerror(errno));
			exit(2);
		}
		if (statvfs(tok, &vfs) == 0) {
			have = (uint64_t)vfs.f_bavail * vfs.f_frsize;
			if (have < need) {
				fprintf(stderr, "nvme-bench: no space in %s: need %s, %s free "
					"(use a smaller --size)\n", tok,
					st_format_bytes(need, a, sizeof(a)),
					st_format_bytes(have, b, sizeof(b)));
				exit(2);
			}
		}
	}
	free(copy);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static double cpu_seconds(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 +
	       (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

struct bench {
	struct st_tier *nvme;
	struct st_extent ext;
	char *buf;            /* qd_max * bs bytes, registered, pinned */
	uint64_t *lat_ns;     /* one per completed request, up to cap */
	size_t lat_cap;
	uint64_t *submit_ns;  /* per slot */
};

/* Keep qd requests of bs in flight over [0, span) for time_s (or, with
 * limit_bytes, until that many bytes moved). Fills p; 0 or -errno. */
static int run_point(struct bench *b, int rw, uint64_t bs, unsigned qd, double time_s,
		     uint64_t span_bytes, uint64_t limit_bytes, struct point *p,
		     void (*progress)(uint64_t done, uint64_t total))
{
	struct st_tier_io io;
	struct st_tier_cqe cqe[64];
	uint64_t next_off = 0, moved = 0, issued = 0, nlat = 0;
	uint64_t t0 = st_now_ns(), deadline = t0 + (uint64_t)(time_s * 1e9), t_end;
	double c0 = cpu_seconds();
	unsigned inflight = 0;
	bool stop = false;
	int ret;

	for (;;) {
		uint64_t now;

		while (!stop && inflight < qd) {
			unsigned slot;

			/* slot = which qd-sized piece of buf, from the request count */
			slot = (unsigned)(issued % qd);
			io = (struct st_tier_io){ .op = rw, .ext = b->ext,
						  .ext_off_bytes = next_off, .len_bytes = bs,
						  .buf = b->buf + (uint64_t)slot * bs,
						  .user = (void *)(uintptr_t)slot };
			b->submit_ns[slot] = st_now_ns();
			ret = st_tier_submit(b->nvme, &io, 1);
			if (ret < 0)
				return ret;
			issued++;
			inflight++;
			next_off += bs;
			if (next_off + bs > span_bytes)
				next_off = 0;
			if (limit_bytes && issued * bs >= limit_bytes)
				stop = true;
		}
		if (!inflight)
			break;
		ret = st_tier_reap(b->nvme, cqe, 64, 1);
		if (ret < 0)
			return ret;
		now = st_now_ns();
		for (int i = 0; i < ret; i++) {
			unsigned slot = (unsigned)(uintptr_t)cqe[i].user;

			if (cqe[i].res < 0)
				return (int)cqe[i].res;
			moved += bs;
			inflight--;
			if (nlat == b->lat_cap) {
				uint64_t *l = realloc(b->lat_ns, 2 * b->lat_cap * sizeof(*l));

				if (!l)
					return -ENOMEM;
				b->lat_ns = l;
				b->lat_cap *= 2;
			}
			b->lat_ns[nlat++] = now - b->submit_ns[slot];
		}
		if (progress)
			progress(moved, limit_bytes);
		if (interrupted || (!limit_bytes && now >= deadline))
			stop = true;
	}
	t_end = st_now_ns();
	if (p) {
		double secs = (double)(t_end - t0) / 1e9;

		qsort(b->lat_ns, nlat, sizeof(uint64_t), cmp_u64);
		p->rw = rw;
		p->bs = bs;
		p->qd = qd;
		p->gbps = (double)moved / secs / 1e9;
		p->iops = (double)nlat / secs;
		p->p50_us = nlat ? (double)b->lat_ns[nlat / 2] / 1e3 : 0;
		p->p99_us = nlat ? (double)b->lat_ns[(size_t)((double)(nlat - 1) * 0.99)] / 1e3 : 0;
		p->cpu_pct = 100.0 * (cpu_seconds() - c0) / secs;
	}
	return 0;
}

static bool show_progress;

static void prefill_progress(uint64_t done, uint64_t total)
{
	static uint64_t last_ns;
	uint64_t now = st_now_ns();
	char a[32], b[32];

	if (!show_progress || (now - last_ns < 500000000ull && done < total))
		return;
	last_ns = now;
	/* On a terminal one line updates in place; in a log, a line a half second. */
	fprintf(stderr, "%s  preparing the file: %s of %s%s", isatty(2) ? "\r" : "",
		st_format_bytes(done, a, sizeof(a)), st_format_bytes(total, b, sizeof(b)),
		isatty(2) && done < total ? "" : "\n");
}

static const char *fmt_bs(uint64_t bs, char *buf, size_t n)
{
	if (bs >= ST_MiB && bs % ST_MiB == 0)
		snprintf(buf, n, "%lluM", (unsigned long long)(bs / ST_MiB));
	else
		snprintf(buf, n, "%lluK", (unsigned long long)(bs / ST_KiB));
	return buf;
}

static int write_json(const char *path, const struct point *pts, unsigned n,
		      const struct point *best_r, const struct point *best_w)
{
	json_object *root = json_object_new_object(), *arr = json_object_new_array();
	json_object *best = json_object_new_object();
	int ret = 0;

	for (unsigned i = 0; i < n; i++) {
		json_object *o = json_object_new_object();

		json_object_object_add(o, "rw", json_object_new_string(
						 pts[i].rw == ST_IO_READ ? "read" : "write"));
		json_object_object_add(o, "bs", json_object_new_int64((int64_t)pts[i].bs));
		json_object_object_add(o, "qd", json_object_new_int((int)pts[i].qd));
		json_object_object_add(o, "gbps", json_object_new_double(pts[i].gbps));
		json_object_object_add(o, "iops", json_object_new_double(pts[i].iops));
		json_object_object_add(o, "p50_us", json_object_new_double(pts[i].p50_us));
		json_object_object_add(o, "p99_us", json_object_new_double(pts[i].p99_us));
		json_object_object_add(o, "cpu_pct", json_object_new_double(pts[i].cpu_pct));
		json_object_array_add(arr, o);
	}
	json_object_object_add(root, "points", arr);
	json_object_object_add(best, "read_gbps", json_object_new_double(best_r ? best_r->gbps : 0));
	json_object_object_add(best, "write_gbps", json_object_new_double(best_w ? best_w->gbps : 0));
	{
		const struct point *b = best_r ? best_r : best_w;

		json_object_object_add(best, "bs", json_object_new_int64(b ? (int64_t)b->bs : 0));
		json_object_object_add(best, "qd", json_object_new_int(b ? (int)b->qd : 0));
	}
	json_object_object_add(root, "best", best);
	/* Temp file then rename: a reader never sees half a file. */
	if (bench_out_write("nvme-bench", path,
			    json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY)) < 0)
		ret = -EIO;
	json_object_put(root);
	return ret;
}

/* The recommendation: the fastest read point, then the smallest bs and qd
 * within 5% of it (less pinned memory for the same speed). */
static const struct point *pick_best(const struct point *pts, unsigned n, int rw)
{
	const struct point *best = NULL;

	for (unsigned i = 0; i < n; i++)
		if (pts[i].rw == rw && (!best || pts[i].gbps > best->gbps))
			best = &pts[i];
	if (!best)
		return NULL;
	for (unsigned i = 0; i < n; i++) {
		const struct point *p = &pts[i];

		if (p->rw == rw && p->gbps >= 0.95 * best->gbps &&
		    p->bs * p->qd < best->bs * best->qd)
			best = p;
	}
	return best;
}

int main(int argc, char **argv)
{
	struct opts o;
	struct point pts[2 * MAX_LIST * MAX_LIST];
	const struct point *best_r, *best_w;
	unsigned npts = 0, total, qd_max = 0;
	uint64_t bs_max = 0;
	struct st_tier *host = NULL;
	struct st_extent hext;
	struct bench b = { 0 };
	struct sigaction sa = { .sa_handler = on_signal };
	int ret = 0;

	parse_args(argc, argv, &o);
	check_dirs(&o);
	if (o.json)
		bench_out_check("nvme-bench", "--json", o.json);
	show_progress = !o.quiet;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	for (unsigned i = 0; i < o.nqd; i++)
		qd_max = ST_MAX(qd_max, o.qd[i]);
	for (unsigned i = 0; i < o.nbs; i++)
		bs_max = ST_MAX(bs_max, o.bs[i]);
	total = o.nbs * o.nqd * o.nrw;

	/* The I/O buffers come from the pinned host tier, as in training, so
	 * they are on 2 MiB huge pages however small (the tier maps whole ones):
	 * a 1 MiB request from 4 KiB pages is 256 segments, which the block
	 * layer splits (1016K + 8K), and the virtio disk serves the halves one
	 * after the other (docs/nvme-bench.md). */
	{
		struct st_tier_config hc = { .budget_bytes = bs_max * qd_max };

		ret = st_tier_create(&st_tier_host_ops, &hc, &host);
		if (ret == 0)
			ret = st_tier_alloc(host, bs_max * qd_max, &hext);
		if (ret < 0) {
			fprintf(stderr, "nvme-bench: cannot get %llu bytes of host buffers: %s\n",
				(unsigned long long)(bs_max * qd_max), st_error_last());
			return 1;
		}
		b.buf = st_tier_addr(host, &hext);
		/* Not zero: a drive that compresses or dedups zeros would flatter. */
		for (uint64_t i = 0; i < bs_max * qd_max; i++)
			b.buf[i] = (char)(i * 2654435761u >> 13);
	}
	b.lat_cap = 1 << 16;
	b.lat_ns = malloc(b.lat_cap * sizeof(*b.lat_ns));
	b.submit_ns = calloc(qd_max, sizeof(*b.submit_ns));

	if (!o.quiet)
		fprintf(stderr, "nvme-bench: %u points of %.1f s on %s, %s of files%s\n", total,
			o.time_s, o.dirs, st_format_bytes(o.size_bytes, (char[32]){ 0 }, 32),
			o.buffered ? ", buffered" : "");
	for (unsigned ib = 0; ib < o.nbs && !interrupted; ib++) {
		struct st_tier_config c = { .budget_bytes = o.size_bytes, .dirs = o.dirs,
					    .block_bytes = o.bs[ib], .queue_depth = qd_max,
					    .buffered = o.buffered };
		struct st_tier_buffer reg = { b.buf, bs_max * qd_max };
		char bsb[32];
		uint64_t span;

		ret = st_tier_create(&st_tier_nvme_ops, &c, &b.nvme);
		if (ret < 0) {
			fprintf(stderr, "nvme-bench: %s\n", st_error_last());
			ret = ret == -ENOSPC ? 2 : 1;
			goto out;
		}
		if (ib == 0 && !o.quiet)
			fprintf(stderr, "  tier: %s\n", st_tier_describe(b.nvme));
		st_tier_register_buffers(b.nvme, &reg, 1);
		span = o.size_bytes / o.bs[ib] * o.bs[ib];
		ret = st_tier_alloc(b.nvme, span, &b.ext);
		if (ret == 0 && !interrupted) {
			/* Reads of never-written blocks are answered without
			 * touching the drive: write the whole span first. */
			bool need_read = o.rw[0] == ST_IO_READ || (o.nrw == 2 && o.rw[1] == ST_IO_READ);

			if (need_read)
				ret = run_point(&b, ST_IO_WRITE, o.bs[ib], qd_max, 0, span, span, NULL,
						prefill_progress);
			/* Let the drive finish its write-back before reads are timed. */
			if (ret == 0 && need_read)
				ret = st_tier_sync(b.nvme);
		}
		for (unsigned ir = 0; ret == 0 && ir < o.nrw && !interrupted; ir++) {
			for (unsigned iq = 0; iq < o.nqd && !interrupted; iq++) {
				struct point *p = &pts[npts];

				ret = run_point(&b, o.rw[ir], o.bs[ib], o.qd[iq], o.time_s, span, 0, p,
						NULL);
				if (ret < 0)
					break;
				if (interrupted)
					break;
				npts++;
				if (!o.quiet)
					fprintf(stderr, "  [%u/%u] %-5s bs %-5s qd %-3u %7.2f GB/s\n",
						npts, total, p->rw == ST_IO_READ ? "read" : "write",
						fmt_bs(p->bs, bsb, sizeof(bsb)), p->qd, p->gbps);
			}
		}
		if (ret < 0) {
			fprintf(stderr, "nvme-bench: %s\n", st_tier_error(b.nvme)[0] ?
				st_tier_error(b.nvme) : st_error_last());
			ret = 1;
			goto out;
		}
		st_tier_free(b.nvme, &b.ext);
		st_tier_destroy(b.nvme);
		b.nvme = NULL;
	}
	if (interrupted) {
		fprintf(stderr, "nvme-bench: interrupted; files removed, no results written\n");
		ret = 130;
		goto out;
	}

	printf("%-6s %8s %5s %9s %10s %9s %9s %6s\n", "rw", "bs", "qd", "GB/s", "IOPS",
	       "p50 us", "p99 us", "CPU%");
	for (unsigned i = 0; i < npts; i++) {
		char bsb[32];

		printf("%-6s %8s %5u %9.3f %10.0f %9.1f %9.1f %6.1f\n",
		       pts[i].rw == ST_IO_READ ? "read" : "write", fmt_bs(pts[i].bs, bsb, sizeof(bsb)),
		       pts[i].qd, pts[i].gbps, pts[i].iops, pts[i].p50_us, pts[i].p99_us,
		       pts[i].cpu_pct);
	}
	best_r = pick_best(pts, npts, ST_IO_READ);
	best_w = pick_best(pts, npts, ST_IO_WRITE);
	{
		const struct point *rec = best_r ? best_r : best_w;
		char bsb[32];

		printf("recommendation: --aio-block %s --aio-depth %u (read %.2f GB/s, write %.2f GB/s)\n",
		       fmt_bs(rec->bs, bsb, sizeof(bsb)), rec->qd, best_r ? best_r->gbps : 0.0,
		       best_w ? best_w->gbps : 0.0);
	}
	if (o.json && write_json(o.json, pts, npts, best_r, best_w) < 0)
		ret = 1;
out:
	if (b.nvme) {
		st_tier_destroy(b.nvme);
	}
	st_tier_destroy(host);
	free(b.lat_ns);
	free(b.submit_ns);
	return ret;
}
