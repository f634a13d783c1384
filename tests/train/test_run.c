/* The run as a library call (strata/run.h), called directly:
 *  1. st_run_train() gives the losses and gradient norms `strata train`
 *     gives for the same flags, bit for bit (their --metrics lines);
 *  2. placement does not change them (everything in vram vs on nvme);
 *  3. the caller's stop flag ends the run after the step it comes in,
 *     saved, and the run says so (stopped, the step);
 *  4. a budget that cannot work is refused as bad input (exit code 2),
 *     with nothing left behind: the --save DIR the run made is removed.
 *
 * test_run STRATA: STRATA is the strata binary that test 1 compares with. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "strata/dataset.h"
#include "strata/family.h"
#include "strata/run.h"

#define STEPS 4
#define MODEL "layers=2,dim=64,heads=2,vocab=256,ctx=64"
static char data_path[4200], dir[4096];
static const char *strata_bin;

/* What on_step saw. */
struct seen {
	int n;
	double loss[16], norm[16];
	volatile sig_atomic_t *stop;
	int stop_after; /* set *stop after this step (0: never) */
};

static void on_step(void *arg, const struct st_run_step *s)
{
	struct seen *v = arg;

	assert_int_equal(s->step, v->n + 1);
	v->loss[v->n] = s->loss;
	v->norm[v->n] = s->grad_norm;
	v->n++;
	if (v->stop_after && s->step == v->stop_after)
		*v->stop = 1;
}

/* The run `strata train` makes of its defaults and the flags of
 * cli_flags() below. */
static void base_config(struct st_run_config *rc, struct st_dataset **ds)
{
	struct st_engine_config *ec = &rc->engine;

	*rc = (struct st_run_config){ .engine = { .device = "cpu",
						  .recompute = ST_RECOMPUTE_AUTO },
				      .data_name = data_path, .model_text = MODEL,
				      .shuffle = true, .log_every = 1, .keep = 3,
				      .max_skipped = 10 };
	st_train_config_default(&ec->train);
	assert_int_equal(st_model_config_parse(MODEL, &ec->train.model), 0);
	ec->train.batch = 4;
	ec->train.seq = 32;
	ec->train.steps = STEPS;
	ec->train.warmup = 2;
	ec->train.seed = 11;
	ec->gpu_mem_bytes = 64ull << 20;
	ec->host_mem_bytes = 64ull << 20;
	ec->nvme_dirs = dir;
	assert_int_equal(st_run_world(ec), 0);
	assert_int_equal(ec->world, 1);
	assert_int_equal(st_dataset_open(ds, data_path, ST_DATASET_AUTO), 0);
	rc->data = *ds;
}

/* The "loss":..,"lr":..,"grad_norm":.. part of every line of a --metrics
 * file, one line each, into out (the timings around them differ). */
static void metrics_numbers(const char *path, char *out, size_t bytes)
{
	FILE *f = fopen(path, "r");
	char line[4096];
	size_t at = 0;

	assert_non_null(f);
	out[0] = 0;
	while (fgets(line, sizeof(line), f)) {
		char *a = strstr(line, "\"loss\":"), *b = strstr(line, ",\"tokens_per_s\"");

		assert_non_null(a);
		assert_non_null(b);
		at += (size_t)snprintf(out + at, bytes - at, "%.*s\n", (int)(b - a), a);
		assert_true(at < bytes);
	}
	fclose(f);
}

static void test_same_as_cli(void **state)
{
	struct st_run_config rc;
	struct st_run_result res;
	struct st_dataset *ds;
	struct seen v = { 0 };
	char lib_m[4300], cli_m[4300], cmd[16384], lib_n[8192], cli_n[8192];
	FILE *out = tmpfile();

	(void)state;
	snprintf(lib_m, sizeof(lib_m), "%s/lib.jsonl", dir);
	snprintf(cli_m, sizeof(cli_m), "%s/cli.jsonl", dir);
	base_config(&rc, &ds);
	rc.metrics = lib_m;
	rc.out = out;
	rc.on_step = on_step;
	rc.arg = &v;
	assert_int_equal(st_run_train(&rc, &res), 0);
	assert_int_equal(res.exit_code, 0);
	assert_int_equal(res.steps_done, STEPS);
	assert_false(res.stopped);
	assert_int_equal(v.n, STEPS);
	for (int i = 0; i < STEPS; i++)
		assert_true(isfinite(v.loss[i]) && v.loss[i] > 0);
	/* the progress lines went to out, not to stdout */
	assert_true(ftell(out) > 0);
	fclose(out);
	st_dataset_close(ds);

	snprintf(cmd, sizeof(cmd),
		 "ST_QUIET=1 '%s' train --model %s --data '%s' --batch 4 --seq 32 --steps %d "
		 "--warmup 2 --seed 11 --gpu-mem 64M --host-mem 64M --nvme '%s' --metrics '%s' "
		 ">/dev/null", strata_bin, MODEL, data_path, STEPS, dir, cli_m);
	assert_int_equal(system(cmd), 0);
	metrics_numbers(lib_m, lib_n, sizeof(lib_n));
	metrics_numbers(cli_m, cli_n, sizeof(cli_n));
	assert_string_equal(lib_n, cli_n);
	/* and on_step saw what the metrics say */
	{
		char first[128];

		snprintf(first, sizeof(first), "\"loss\":%.9g,", v.loss[0]);
		assert_memory_equal(lib_n, first, strlen(first));
	}
}

/* W in vram and the optimizer in host, then every state on nvme: the
 * same numbers. */
static void test_placement(void **state)
{
	struct seen v[2] = { { 0 }, { 0 } };

	(void)state;
	for (int k = 0; k < 2; k++) {
		struct st_run_config rc;
		struct st_run_result res;
		struct st_dataset *ds;

		base_config(&rc, &ds);
		rc.engine.params = k ? ST_OFFLOAD_NVME : ST_OFFLOAD_NONE;
		rc.engine.optim = k ? ST_OFFLOAD_NVME : ST_OFFLOAD_HOST;
		rc.on_step = on_step;
		rc.arg = &v[k];
		assert_int_equal(st_run_train(&rc, &res), 0);
		st_dataset_close(ds);
	}
	assert_int_equal(v[0].n, STEPS);
	assert_int_equal(v[1].n, STEPS);
	assert_memory_equal(v[0].loss, v[1].loss, sizeof(v[0].loss));
	assert_memory_equal(v[0].norm, v[1].norm, sizeof(v[0].norm));
}

static void test_stop(void **state)
{
	static volatile sig_atomic_t stop;
	struct st_run_config rc;
	struct st_run_result res;
	struct st_dataset *ds;
	struct seen v = { .stop = &stop, .stop_after = 2 };
	char save[4300], latest[4400];
	struct stat st;

	(void)state;
	stop = 0;
	snprintf(save, sizeof(save), "%s/stop-save", dir);
	base_config(&rc, &ds);
	rc.save = save;
	rc.stop = &stop;
	rc.on_step = on_step;
	rc.arg = &v;
	assert_int_equal(st_run_train(&rc, &res), 0);
	assert_true(res.stopped);
	assert_int_equal(res.steps_done, 2);
	assert_int_equal(v.n, 2);
	snprintf(latest, sizeof(latest), "%s/latest", save);
	assert_int_equal(stat(latest, &st), 0);
	st_dataset_close(ds);
}

static void test_refused(void **state)
{
	struct st_run_config rc;
	struct st_run_result res;
	struct st_dataset *ds;
	char save[4300];
	struct stat st;
	int ret;

	(void)state;
	snprintf(save, sizeof(save), "%s/refused/a/b", dir);
	base_config(&rc, &ds);
	rc.engine.gpu_mem_bytes = 64 << 10; /* not even one unit */
	rc.engine.host_mem_bytes = 64 << 10;
	rc.engine.nvme_dirs = NULL;
	rc.save = save;
	ret = st_run_train(&rc, &res);
	assert_true(ret < 0);
	assert_int_equal(res.exit_code, 2);
	assert_false(res.quiet);
	assert_true(strlen(st_error_last()) > 0);
	/* the DIR it made, with its parents, is gone */
	snprintf(save, sizeof(save), "%s/refused", dir);
	assert_int_equal(stat(save, &st), -1);
	st_dataset_close(ds);
}

static int setup(void **state)
{
	const char *base = getenv("ST_TEST_DIR");
	FILE *f;
	uint64_t x = 99;

	(void)state;
	snprintf(dir, sizeof(dir), "%s/run-test.XXXXXX", base && *base ? base : "/var/tmp");
	if (!mkdtemp(dir))
		return -1;
	snprintf(data_path, sizeof(data_path), "%s/data.txt", dir);
	f = fopen(data_path, "w");
	if (!f)
		return -1;
	for (int i = 0; i < 20000; i++) {
		static const char *w[] = { "the ", "run ", "is ", "a ", "library ", "call ",
					   "that ", "tests ", "and ", "tools. " };

		x = x * 6364136223846793005ull + 1442695040888963407ull;
		fputs(w[(x >> 33) % 10], f);
	}
	fclose(f);
	return 0;
}

static int teardown(void **state)
{
	char cmd[4200];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_same_as_cli),
		cmocka_unit_test(test_placement),
		cmocka_unit_test(test_stop),
		cmocka_unit_test(test_refused),
	};

	if (argc < 2) {
		fprintf(stderr, "usage: test_run STRATA\n");
		return 2;
	}
	strata_bin = argv[1];
	return cmocka_run_group_tests(tests, setup, teardown);
}
