/* Helpers shared by the strata subcommands. */
#include "cli.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void st_cli_die(int code, const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	fputs("strata: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(code);
}

long st_cli_long(const char *flag, const char *s, long lo, long hi)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		st_cli_die(2, "%s %s: expected a whole number from %ld to %ld", flag, s, lo, hi);
	return v;
}

double st_cli_double(const char *flag, const char *s, double lo, double hi)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
		st_cli_die(2, "%s %s: expected a number from %g to %g", flag, s, lo, hi);
	return v;
}

void set_threads_cli(int n)
{
	if (n > 0) {
		omp_set_num_threads(n);
		openblas_set_num_threads(n);
	}
}

struct st_dataset *st_cli_open_data(const char *path, int vocab)
{
	struct st_dataset *ds;
	struct stat st;

	if (stat(path, &st) < 0)
		st_cli_die(2, "--data %s: %s", path, strerror(errno));
	if (!S_ISREG(st.st_mode))
		st_cli_die(2, "--data %s: not a regular file", path);
	if (st_dataset_open(&ds, path, ST_DATASET_AUTO) < 0)
		st_cli_die(2, "--data %s: %s", path, st_error_last());
	if (st_dataset_max_token(ds) >= (uint32_t)vocab)
		st_cli_die(2, "--data %s: token %u is outside the model's vocabulary of %d", path,
			   st_dataset_max_token(ds), vocab);
	return ds;
}

const char *st_cli_eta(double s, char *buf, size_t n)
{
	if (!isfinite(s) || s < 0)
		snprintf(buf, n, "?");
	else if (s < 60)
		snprintf(buf, n, "%.0fs", s);
	else if (s < 3600)
		snprintf(buf, n, "%dm%02ds", (int)s / 60, (int)s % 60);
	else
		snprintf(buf, n, "%dh%02dm", (int)s / 3600, (int)s % 3600 / 60);
	return buf;
}

const char *st_cli_ckpt_dir(const char *dir)
{
	static char buf[4096];
	struct stat st;

	snprintf(buf, sizeof(buf), "%.4000s/config.json", dir);
	if (stat(buf, &st) == 0)
		return dir;
	snprintf(buf, sizeof(buf), "%.4000s/latest", dir);
	if (stat(buf, &st) == 0 && S_ISDIR(st.st_mode))
		return buf;
	return dir;
}
