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
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(st_error_buf, sizeof(st_error_buf), fmt, ap);
	va_end(ap);
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

int st_parse_size(const char *text, uint64_t *out_bytes)
{
	const char *p = text;
	char *end;
	double v, mult = 1.0;

	if (!text || !*text)
		return -EINVAL;
	while (*p == ' ')
		p++;
	if (*p == '-' || *p == '+' || !(*p >= '0' && *p <= '9'))
		return -EINVAL;
	errno = 0;
	v = strtod(p, &end);
	if (errno || end == p || !isfinite(v) || v < 0)
		return -EINVAL;
	switch (*end) {
	case 'k': case 'K': mult = (double)ST_KiB; end++; break;
	case 'm': case 'M': mult = (double)ST_MiB; end++; break;
	case 'g': case 'G': mult = (double)ST_GiB; end++; break;
	case 't': case 'T': mult = (double)ST_GiB * 1024.0; end++; break;
	default: break;
	}
	if (mult > 1.0 && *end == 'i')
		end++;
	if (*end == 'b' || *end == 'B')
		end++;
	if (*end != '\0')
		return -EINVAL;
	v *= mult;
	if (v >= 18446744073709551615.0 || v != floor(v))
		return -EINVAL;
	*out_bytes = (uint64_t)v;
	return 0;
}

const char *st_format_bytes(uint64_t bytes, char *buf, size_t buf_len)
{
	static const char *units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double v = (double)bytes;
	unsigned u = 0;

	while (v >= 1024.0 && u + 1 < ST_ARRAY_LEN(units)) {
		v /= 1024.0;
		u++;
	}
	if (u == 0)
		snprintf(buf, buf_len, "%llu B", (unsigned long long)bytes);
	else
		snprintf(buf, buf_len, "%.2f %s", v, units[u]);
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
