/* Error context, clock, size parsing: the few helpers every seam shares. */
#include "strata/common.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static _Thread_local char st_error_buf[512];

int st_error_set(int err, const char *fmt, ...)
{
	char msg[sizeof(st_error_buf)]; /* an argument may be st_error_last() */
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	memcpy(st_error_buf, msg, sizeof(msg));
	return err;
}

const char *st_error_last(void)
{
	return st_error_buf;
}

void st_error_clear(void)
{
	st_error_buf[0] = '\0';
}

uint64_t st_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* text as a size; *exact false when a fraction does not come to whole
 * bytes (*out_bytes then the whole bytes below it). */
static int parse_size(const char *text, uint64_t *out_bytes, bool *exact)
{
	const char *p = text;
	unsigned __int128 whole = 0, frac = 0, den = 1, v;
	unsigned shift = 0;

	/* Exact decimal: digits [. digits] [K|M|G|T [i]] [B]. No signs, spaces,
	 * hex or exponents: a size on a command line is never meant that way. */
	if (!p || !(*p >= '0' && *p <= '9'))
		return -EINVAL;
	for (; *p >= '0' && *p <= '9'; p++) {
		whole = whole * 10 + (unsigned)(*p - '0');
		if (whole > UINT64_MAX)
			return -EINVAL;
	}
	if (*p == '.') {
		p++;
		if (!(*p >= '0' && *p <= '9'))
			return -EINVAL;
		for (; *p >= '0' && *p <= '9'; p++) {
			if (den > (unsigned __int128)1e18)
				return -EINVAL; /* more digits than any size needs */
			frac = frac * 10 + (unsigned)(*p - '0');
			den *= 10;
		}
	}
	switch (*p) {
	case 'k': case 'K': shift = 10; p++; break;
	case 'm': case 'M': shift = 20; p++; break;
	case 'g': case 'G': shift = 30; p++; break;
	case 't': case 'T': shift = 40; p++; break;
	default: break;
	}
	if (shift && *p == 'i')
		p++;
	if (*p == 'b' || *p == 'B')
		p++;
	if (*p != '\0')
		return -EINVAL;
	*exact = ((frac << shift) % den) == 0;
	v = (whole << shift) + ((frac << shift) / den);
	if (v > UINT64_MAX || (whole << shift) >> shift != whole)
		return -EINVAL;
	*out_bytes = (uint64_t)v;
	return 0;
}

int st_parse_size(const char *text, uint64_t *out_bytes)
{
	uint64_t v;
	bool exact;
	int ret = parse_size(text, &v, &exact);

	/* a fraction must come to whole bytes ("1.5K" yes, "1.1K" no) */
	if (ret < 0 || !exact)
		return -EINVAL;
	*out_bytes = v;
	return 0;
}

int st_parse_size_paged(const char *text, uint64_t page, uint64_t *out_bytes)
{
	uint64_t v;
	bool exact;
	int ret = parse_size(text, &v, &exact);

	if (ret < 0)
		return ret;
	*out_bytes = exact ? v : v / page * page;
	return 0;
}

const char *st_format_bytes(uint64_t bytes, char *buf, size_t buf_len)
{
	static const char *units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double v = (double)bytes;
	unsigned u = 0;

	/* 1023.996 KiB would print as "1024.00 KiB": move up a unit first. */
	while (v >= 1023.995 && u + 1 < ST_ARRAY_LEN(units)) {
		v /= 1024.0;
		u++;
	}
	if (u == 0)
		snprintf(buf, buf_len, "%llu B", (unsigned long long)bytes);
	else
		snprintf(buf, buf_len, "%.2f %s", v, units[u]);
	return buf;
}

const char *st_format_eta(double s, char *buf, size_t n)
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

void st_warn(const char *fmt, ...)
{
	const char *q = getenv("ST_QUIET");
	va_list ap;

	if (q && *q && strcmp(q, "0") != 0)
		return;
	va_start(ap, fmt);
	fputs("strata: warning: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}
