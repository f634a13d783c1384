/* Util tests: size parsing (exact byte values, refusals), byte formatting,
 * and the per-thread error context. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "strata/common.h"

struct size_case {
	const char *text;
	uint64_t bytes;
};

static void test_parse_size_accepts(void **state)
{
	/* References are built from shifts, independently of the parser's
	 * floating-point path. */
	const struct size_case ok[] = {
		{ "4096", 4096 },
		{ "0", 0 },
		{ "1", 1 },
		{ "128K", 128ull << 10 },
		{ "128k", 128ull << 10 },
		{ "1M", 1ull << 20 },
		{ "1m", 1ull << 20 },
		{ "4G", 4ull << 30 },
		{ "1.5G", 3ull << 29 },
		{ "0.5K", 512 },
		{ "1.25M", 5ull << 18 },
		{ "4GiB", 4ull << 30 },
		{ "4gb", 4ull << 30 },
		{ "4GB", 4ull << 30 },
		{ "16KiB", 16ull << 10 },
		{ "4096B", 4096 },
		{ "2T", 2ull << 40 },
		{ "0G", 0 },
		/* The largest T multiple below 2^64 is exact in a double. */
		{ "16777215T", 16777215ull << 40 },
		{ "4294967295", 4294967295ull },
	};

	(void)state;
	for (size_t i = 0; i < ST_ARRAY_LEN(ok); i++) {
		uint64_t got = 0xdeadbeefull;
		int ret = st_parse_size(ok[i].text, &got);

		if (ret != 0)
			fail_msg("\"%s\" refused (%d)", ok[i].text, ret);
		if (got != ok[i].bytes)
			fail_msg("\"%s\" -> %llu, want %llu", ok[i].text,
				 (unsigned long long)got, (unsigned long long)ok[i].bytes);
	}
}

static void test_parse_size_refuses(void **state)
{
	const char *bad[] = {
		"", "-1", "-0", "+4", "abc", "4X", "1.5", "0.3K", "1e400", "1e-400",
		"99999999999999999999G", "16777216T", "17179869184G",
		"18446744073709551616", " 4G junk", "4G junk", "4G ", "4 G", "G",
		"4GG", "4iB", "4Bi", "nan", "inf", ".5K", "4G\n",
	};

	(void)state;
	for (size_t i = 0; i < ST_ARRAY_LEN(bad); i++) {
		const uint64_t sentinel = 0x5a5a5a5a5a5a5a5aull;
		uint64_t got = sentinel;
		int ret = st_parse_size(bad[i], &got);

		if (ret != -EINVAL)
			fail_msg("\"%s\" gave %d (value %llu), want -EINVAL", bad[i], ret,
				 (unsigned long long)got);
		/* A refusal leaves the output alone. */
		assert_true(got == sentinel);
	}
	{
		uint64_t got = 0;

		assert_int_equal(st_parse_size(NULL, &got), -EINVAL);
	}
}

/* Budgets on a command line: a fraction rounds down to whole pages;
 * what is exact stays; what is no size stays refused. */
static void test_parse_size_paged(void **state)
{
	const struct size_case ok[] = {
		/* 2.3 * 2^30 = 2469606195.2: 602931 pages of 4096 lie below */
		{ "2.3G", 602931ull * 4096 },
		{ "0.3K", 0 },
		{ "1.1M", 281ull * 4096 }, /* 1153433.6 / 4096 = 281.6 */
		{ "1.5G", 3ull << 29 },
		{ "4097", 4097 }, /* exact: kept */
	};
	const char *bad[] = { "", "abc", "4G junk", "-1", "16777216T" };

	(void)state;
	for (size_t i = 0; i < ST_ARRAY_LEN(ok); i++) {
		uint64_t got = 1;

		assert_int_equal(st_parse_size_paged(ok[i].text, 4096, &got), 0);
		if (got != ok[i].bytes)
			fail_msg("\"%s\" -> %llu, want %llu", ok[i].text,
				 (unsigned long long)got, (unsigned long long)ok[i].bytes);
	}
	for (size_t i = 0; i < ST_ARRAY_LEN(bad); i++) {
		uint64_t got = 7;

		assert_int_equal(st_parse_size_paged(bad[i], 4096, &got), -EINVAL);
		assert_true(got == 7);
	}
}

struct fmt_case {
	uint64_t bytes;
	const char *text;
};

static void test_format_bytes(void **state)
{
	const struct fmt_case cases[] = {
		{ 0, "0 B" },
		{ 1, "1 B" },
		{ 1023, "1023 B" },
		{ 1024, "1.00 KiB" },
		{ 1536, "1.50 KiB" },
		{ 1ull << 20, "1.00 MiB" },
		{ 3ull << 29, "1.50 GiB" },
		{ (4ull << 30) - 1, "4.00 GiB" },
		{ 5ull << 40, "5.00 TiB" },
		/* Past TiB there is no larger unit: it keeps counting TiB. */
		{ 2048ull << 40, "2048.00 TiB" },
		{ UINT64_MAX, "16777216.00 TiB" },
	};
	char buf[64];

	(void)state;
	for (size_t i = 0; i < ST_ARRAY_LEN(cases); i++) {
		memset(buf, 'x', sizeof(buf));
		assert_ptr_equal(st_format_bytes(cases[i].bytes, buf, sizeof(buf)), buf);
		assert_string_equal(buf, cases[i].text);
	}
	/* The documented minimum of 16 bytes holds even the largest value. */
	{
		char small[16];

		st_format_bytes(UINT64_MAX, small, sizeof(small));
		assert_string_equal(small, "16777216.00 TiB");
	}
	/* A short buffer is truncated and terminated, never overrun. */
	{
		char b[8 + 4];

		memset(b, '#', sizeof(b));
		st_format_bytes(3ull << 29, b, 8);
		assert_string_equal(b, "1.50 Gi");
		for (size_t i = 8; i < sizeof(b); i++)
			assert_int_equal(b[i], '#');
	}
}

/* The formatted value parses back to within the rounding of two decimals. */
static void test_format_parse_round_trip(void **state)
{
	uint64_t s = 12345;

	(void)state;
	for (int i = 0; i < 1000; i++) {
		uint64_t v, back;
		char buf[32], num[32];
		double rel;
		const char *sp;
		size_t n;

		s = s * 6364136223846793005ull + 1442695040888963407ull;
		v = s >> (s % 50 + 14); /* spread over many magnitudes */
		st_format_bytes(v, buf, sizeof(buf));
		/* "1.23 GiB" -> "1.23GiB" is a valid size only when it is a
		 * whole number of bytes; compare the number instead. */
		sp = strchr(buf, ' ');
		assert_non_null(sp);
		n = (size_t)(sp - buf);
		memcpy(num, buf, n);
		num[n] = '\0';
		if (strcmp(sp + 1, "B") == 0) {
			assert_int_equal(st_parse_size(num, &back), 0);
			assert_true(back == v);
			continue;
		}
		{
			double x = 0;
			uint64_t unit = strcmp(sp + 1, "KiB") == 0 ? 1ull << 10 :
					strcmp(sp + 1, "MiB") == 0 ? 1ull << 20 :
					strcmp(sp + 1, "GiB") == 0 ? 1ull << 30 : 1ull << 40;

			assert_int_equal(sscanf(num, "%lf", &x), 1);
			rel = (x * (double)unit - (double)v) / (double)v;
			if (rel > 0.005 || rel < -0.005)
				fail_msg("%llu formatted as %s", (unsigned long long)v, buf);
			assert_true(x >= 1.0 && (x < 1024.0 || unit == (1ull << 40) ||
						 strcmp(num, "1024.00") == 0));
		}
	}
}

static void test_error_set_returns_err(void **state)
{
	(void)state;
	st_error_clear();
	assert_string_equal(st_error_last(), "");
	assert_int_equal(st_error_set(-EIO, "read %s offset %d", "/x/y", 4096), -EIO);
	assert_string_equal(st_error_last(), "read /x/y offset 4096");
	assert_int_equal(st_error_set(-ENOSPC, "second"), -ENOSPC);
	assert_string_equal(st_error_last(), "second");
	/* context added to a callee's detail: the detail is an argument */
	st_error_set(-EIO, "outer %s: %s", "/dir", st_error_last());
	assert_string_equal(st_error_last(), "outer /dir: second");
	st_error_clear();
	assert_string_equal(st_error_last(), "");
}

static void test_error_long_message_truncated(void **state)
{
	char big[2000];
	size_t len;

	(void)state;
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	st_error_set(-EINVAL, "%s", big);
	len = strlen(st_error_last());
	assert_true(len > 0 && len < sizeof(big) - 1);
	assert_memory_equal(st_error_last(), big, len);
	st_error_clear();
}

struct thread_view {
	char seen_at_start[64];
	char seen_at_end[64];
	pthread_barrier_t *bar;
};

static void *error_thread(void *arg)
{
	struct thread_view *v = arg;

	/* The main thread has set its message before the barrier. */
	pthread_barrier_wait(v->bar);
	snprintf(v->seen_at_start, sizeof(v->seen_at_start), "%s", st_error_last());
	st_error_set(-EIO, "from the second thread");
	pthread_barrier_wait(v->bar);
	/* The main thread sets another message between these barriers. */
	pthread_barrier_wait(v->bar);
	snprintf(v->seen_at_end, sizeof(v->seen_at_end), "%s", st_error_last());
	return NULL;
}

static void test_error_thread_local(void **state)
{
	pthread_barrier_t bar;
	struct thread_view v = { .bar = &bar };
	pthread_t th;

	(void)state;
	assert_int_equal(pthread_barrier_init(&bar, NULL, 2), 0);
	assert_int_equal(pthread_create(&th, NULL, error_thread, &v), 0);
	st_error_set(-EINVAL, "from the main thread");
	pthread_barrier_wait(&bar);
	pthread_barrier_wait(&bar);
	/* The second thread's message did not replace ours. */
	assert_string_equal(st_error_last(), "from the main thread");
	st_error_set(-EINVAL, "main again");
	pthread_barrier_wait(&bar);
	assert_int_equal(pthread_join(th, NULL), 0);
	pthread_barrier_destroy(&bar);
	assert_string_equal(v.seen_at_start, "");
	assert_string_equal(v.seen_at_end, "from the second thread");
	assert_string_equal(st_error_last(), "main again");
	st_error_clear();
}

static void test_align_and_clock(void **state)
{
	uint64_t t0, t1;

	(void)state;
	assert_int_equal(st_align_up(0, 4096), 0);
	assert_int_equal(st_align_up(1, 4096), 4096);
	assert_int_equal(st_align_up(4096, 4096), 4096);
	assert_int_equal(st_align_up(4097, 4096), 8192);
	assert_true(st_is_pow2(1) && st_is_pow2(4096) && st_is_pow2(1ull << 63));
	assert_false(st_is_pow2(0) || st_is_pow2(3) || st_is_pow2(4097));
	t0 = st_now_ns();
	t1 = st_now_ns();
	assert_true(t1 >= t0);
	assert_true(t0 > 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_size_accepts),
		cmocka_unit_test(test_parse_size_refuses),
		cmocka_unit_test(test_parse_size_paged),
		cmocka_unit_test(test_format_bytes),
		cmocka_unit_test(test_format_parse_round_trip),
		cmocka_unit_test(test_error_set_returns_err),
		cmocka_unit_test(test_error_long_message_truncated),
		cmocka_unit_test(test_error_thread_local),
		cmocka_unit_test(test_align_and_clock),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
