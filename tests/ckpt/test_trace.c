/* Chrome trace writer: spans from two threads, lanes, counters, escaping,
 * timestamps, atomic output. The file is parsed back with json-c. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "strata/trace.h"

#include <dirent.h>
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SPANS_PER_THREAD 2000
/* Spans start at anchor + i * STRIDE_NS + lane, last 1000 + i ns. */
#define STRIDE_NS 1234567ull

/* Names that need every kind of escaping JSON has, and UTF-8. */
static const char *const lane_names[2] = { "compute \"q\" \\ \n\t\x01",
					   "h2d \xc3\xa9" };

struct worker {
	struct st_trace *t;
	int lane;
	int index;
	uint64_t anchor_ns;
};

static char tmp_dir[64];

static int setup(void **state)
{
	ST_UNUSED(state);
	snprintf(tmp_dir, sizeof(tmp_dir), "/tmp/st-trace-XXXXXX");
	return mkdtemp(tmp_dir) ? 0 : -1;
}

static int teardown(void **state)
{
	DIR *d = opendir(tmp_dir);
	struct dirent *de;
	char p[512];

	ST_UNUSED(state);
	while (d && (de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(p, sizeof(p), "%s/%s", tmp_dir, de->d_name);
		unlink(p);
	}
	if (d)
		closedir(d);
	rmdir(tmp_dir);
	return 0;
}

static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	while (d && (de = readdir(d)))
		n += de->d_name[0] != '.';
	if (d)
		closedir(d);
	return n;
}

static void span_name(char *buf, size_t len, int index, int i)
{
	snprintf(buf, len, "w%d \"op\" %d", index, i);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	char name[64], args[64];

	for (int i = 0; i < SPANS_PER_THREAD; i++) {
		uint64_t t0 = w->anchor_ns + (uint64_t)i * STRIDE_NS +
			      (uint64_t)w->index;

		span_name(name, sizeof(name), w->index, i);
		snprintf(args, sizeof(args), "{\"i\":%d,\"w\":%d}", i, w->index);
		st_trace_span(w->t, w->lane, name, t0, t0 + 1000 + (uint64_t)i,
			      i % 2 ? args : NULL);
	}
	return NULL;
}

static struct json_object *get(struct json_object *o, const char *key)
{
	struct json_object *v = NULL;

	json_object_object_get_ex(o, key, &v);
	return v;
}

static const char *get_str(struct json_object *o, const char *key)
{
	struct json_object *v = get(o, key);

	return v && json_object_is_type(v, json_type_string)
		? json_object_get_string(v) : NULL;
}

static void test_two_threads(void **state)
{
	struct st_trace *t = NULL;
	struct worker w[2];
	pthread_t th[2];
	char path[128], name[64];
	uint64_t anchor;
	struct json_object *root, *events;
	int lanes[2], seen[2][SPANS_PER_THREAD];
	double anchor_ts = -1;
	int n_names = 0, process_named = 0, counters = 0, instants = 0;
	bool clamped_ok = false;

	ST_UNUSED(state);
	snprintf(path, sizeof(path), "%s/trace.json", tmp_dir);
	assert_int_equal(st_trace_create(&t, path), 0);
	assert_non_null(t);
	/* Spans may start a little after creation; the anchor span pins
	 * the origin so every other timestamp can be checked exactly. */
	anchor = st_now_ns() + 1000;
	for (int k = 0; k < 2; k++) {
		lanes[k] = st_trace_lane(t, lane_names[k]);
		assert_true(lanes[k] >= 1);
	}
	assert_int_not_equal(lanes[0], lanes[1]);
	st_trace_span(t, lanes[0], "anchor", anchor, anchor, NULL);
	/* Before the origin: clamped to ts 0. */
	st_trace_span(t, lanes[0], "early", 5, 7, NULL);
	st_trace_counter(t, "host bytes in use", anchor + 500, 123456789012.0);
	st_trace_instant(t, lanes[1], "step 1", anchor + 999);
	for (int k = 0; k < 2; k++) {
		w[k] = (struct worker){ .t = t, .lane = lanes[k], .index = k,
					.anchor_ns = anchor };
		assert_int_equal(pthread_create(&th[k], NULL, worker_main, &w[k]),
				 0);
	}
	for (int k = 0; k < 2; k++)
		pthread_join(th[k], NULL);
	/* Nothing at the target before close. */
	assert_int_not_equal(access(path, F_OK), 0);
	assert_int_equal(st_trace_close(t), 0);
	assert_int_equal(count_entries(tmp_dir), 1); /* no temporary left */

	root = json_object_from_file(path);
	assert_non_null(root);
	assert_string_equal(get_str(root, "displayTimeUnit"), "ms");
	events = get(root, "traceEvents");
	assert_non_null(events);
	assert_true(json_object_is_type(events, json_type_array));
	memset(seen, 0, sizeof(seen));

	/* The anchor first, so spans can be checked against it. */
	for (size_t i = 0; i < json_object_array_length(events); i++) {
		struct json_object *e = json_object_array_get_idx(events, i);

		if (strcmp(get_str(e, "name"), "anchor") == 0)
			anchor_ts = json_object_get_double(get(e, "ts"));
	}
	assert_true(anchor_ts >= 0);

	for (size_t i = 0; i < json_object_array_length(events); i++) {
		struct json_object *e = json_object_array_get_idx(events, i);
		const char *ph = get_str(e, "ph"), *nm = get_str(e, "name");

		assert_non_null(ph);
		assert_non_null(nm);
		assert_int_equal(json_object_get_int(get(e, "pid")), 1);
		if (strcmp(ph, "M") == 0) {
			struct json_object *args = get(e, "args");

			if (strcmp(nm, "process_name") == 0) {
				assert_string_equal(get_str(args, "name"),
						    "strata");
				process_named++;
			} else if (strcmp(nm, "thread_name") == 0) {
				int tid = json_object_get_int(get(e, "tid"));
				int k = tid == lanes[0] ? 0 : 1;

				assert_true(tid == lanes[0] || tid == lanes[1]);
				assert_string_equal(get_str(args, "name"),
						    lane_names[k]);
				n_names++;
			}
			continue;
		}
		if (strcmp(ph, "C") == 0) {
			assert_string_equal(nm, "host bytes in use");
			assert_true(json_object_get_double(get(get(e, "args"),
							       "value")) ==
				    123456789012.0);
			assert_true(fabs(json_object_get_double(get(e, "ts")) -
					 (anchor_ts + 0.5)) < 1e-6);
			counters++;
			continue;
		}
		if (strcmp(ph, "i") == 0) {
			assert_string_equal(nm, "step 1");
			assert_int_equal(json_object_get_int(get(e, "tid")),
					 lanes[1]);
			assert_true(fabs(json_object_get_double(get(e, "ts")) -
					 (anchor_ts + 0.999)) < 1e-6);
			instants++;
			continue;
		}
		assert_string_equal(ph, "X");
		if (strcmp(nm, "anchor") == 0)
			continue;
		if (strcmp(nm, "early") == 0) {
			assert_true(json_object_get_double(get(e, "ts")) == 0.0);
			assert_true(json_object_get_double(get(e, "dur")) == 0.0);
			clamped_ok = true;
			continue;
		}
		{
			int k, idx, tid = json_object_get_int(get(e, "tid"));
			double ts = json_object_get_double(get(e, "ts"));
			double dur = json_object_get_double(get(e, "dur"));
			struct json_object *args = get(e, "args");

			assert_int_equal(sscanf(nm, "w%d \"op\" %d", &k, &idx), 2);
			assert_true(k >= 0 && k < 2);
			assert_true(idx >= 0 && idx < SPANS_PER_THREAD);
			span_name(name, sizeof(name), k, idx);
			assert_string_equal(nm, name);
			assert_int_equal(tid, lanes[k]);
			/* Exact to the nanosecond (1e-3 us). */
			assert_true(fabs(ts - anchor_ts -
					 ((double)idx * STRIDE_NS + k) / 1000.0)
				    < 1e-4);
			assert_true(fabs(dur - (1000.0 + idx) / 1000.0) < 1e-6);
			if (idx % 2) {
				assert_non_null(args);
				assert_int_equal(json_object_get_int(get(args, "i")),
						 idx);
				assert_int_equal(json_object_get_int(get(args, "w")),
						 k);
			} else {
				assert_null(args);
			}
			seen[k][idx]++;
		}
	}
	for (int k = 0; k < 2; k++)
		for (int i = 0; i < SPANS_PER_THREAD; i++)
			assert_int_equal(seen[k][i], 1);
	assert_int_equal(process_named, 1);
	assert_int_equal(n_names, 2);
	assert_int_equal(counters, 1);
	assert_int_equal(instants, 1);
	assert_true(clamped_ok);
	json_object_put(root);
	unlink(path);
}

static void test_null_and_errors(void **state)
{
	struct st_trace *t = (struct st_trace *)1;
	char path[128];

	ST_UNUSED(state);
	/* Tracing off: every call is a no-op. */
	assert_int_equal(st_trace_lane(NULL, "x"), 0);
	st_trace_span(NULL, 0, "x", 1, 2, NULL);
	st_trace_counter(NULL, "x", 1, 2.0);
	st_trace_instant(NULL, 0, "x", 1);
	assert_int_equal(st_trace_close(NULL), 0);
	st_trace_abort(NULL);

	snprintf(path, sizeof(path), "%s/no/such/dir/trace.json", tmp_dir);
	assert_int_equal(st_trace_create(&t, path), -ENOENT);
	assert_null(t);
	assert_non_null(strstr(st_error_last(), "trace.json"));

	/* abort leaves nothing behind; an empty trace is valid JSON. */
	snprintf(path, sizeof(path), "%s/aborted.json", tmp_dir);
	assert_int_equal(st_trace_create(&t, path), 0);
	st_trace_lane(t, "compute");
	st_trace_abort(t);
	assert_int_equal(count_entries(tmp_dir), 0);

	snprintf(path, sizeof(path), "%s/empty.json", tmp_dir);
	assert_int_equal(st_trace_create(&t, path), 0);
	assert_int_equal(st_trace_close(t), 0);
	{
		struct json_object *root = json_object_from_file(path);

		assert_non_null(root);
		assert_int_equal(json_object_array_length(get(root,
							      "traceEvents")),
				 1); /* process_name */
		json_object_put(root);
	}
	unlink(path);

	/* A target that cannot be replaced (a non-empty directory): close
	 * fails naming both files, removes the temporary, and the target is
	 * left as it was. */
	snprintf(path, sizeof(path), "%s/busy.json", tmp_dir);
	assert_int_equal(mkdir(path, 0755), 0);
	{
		char inner[160];
		FILE *f;

		snprintf(inner, sizeof(inner), "%s/keep", path);
		f = fopen(inner, "w");
		assert_non_null(f);
		fclose(f);
		assert_int_equal(st_trace_create(&t, path), 0);
		st_trace_lane(t, "compute");
		assert_int_equal(count_entries(tmp_dir), 2); /* + temporary */
		assert_true(st_trace_close(t) < 0);
		assert_non_null(strstr(st_error_last(), "rename from"));
		assert_non_null(strstr(st_error_last(), "busy.json.tmp."));
		assert_int_equal(count_entries(tmp_dir), 1);
		assert_int_equal(count_entries(path), 1);
		assert_int_equal(unlink(inner), 0);
	}
	assert_int_equal(rmdir(path), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_two_threads),
		cmocka_unit_test(test_null_and_errors),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
