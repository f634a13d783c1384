/* Two engines stepped alternately over the same data (tools/offload_bench.c
 * and split_bench.c): the options both take, one data file, two loaders in
 * the same order, two engines, and a step that runs both, each going first
 * every other step so the machine's noise falls on both, and holds their
 * losses and gradient norms bit-identical, which every placement the pair
 * compares promises. */
#ifndef STRATA_TOOLS_BENCH_PAIR_H
#define STRATA_TOOLS_BENCH_PAIR_H

#include "strata/dataset.h"
#include "strata/device.h"
#include "strata/engine.h"
#include "bench_stats.h"
#include "strata/trace.h"
#include "bench_out.h"

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Bad input: one line and exit 2. */
static inline void bench_die2(const char *prog, const char *msg, const char *arg)
{
	fprintf(stderr, "%s: %s%s (see --help)\n", prog, msg, arg ? arg : "");
	exit(2);
}

/* The options of both tools; each sets its own defaults first. */
struct bench_opts {
	const char *model, *nvme, *device, *data, *json;
	int batch, seq, steps, threads;
	uint64_t gpu, host;
};

/* getopt_long's rows for them, the letters bench_opts_take() knows */
#define BENCH_OPTS_LONGS                                                                 \
	{ "model", 1, 0, 'm' }, { "batch", 1, 0, 'B' }, { "seq", 1, 0, 'T' },            \
	{ "steps", 1, 0, 's' }, { "nvme", 1, 0, 'n' }, { "gpu-mem", 1, 0, 'g' },         \
	{ "host-mem", 1, 0, 'H' }, { "threads", 1, 0, 'j' }, { "json", 1, 0, 'J' },      \
	{ "device", 1, 0, 'D' }, { "data", 1, 0, 'd' }

static inline int bench_int(const char *prog, const char *name, const char *v, int max)
{
	int x;

	if (bench_parse_int(v, 1, max, &x)) {
		char msg[64];

		snprintf(msg, sizeof(msg), "bad --%s ", name);
		bench_die2(prog, msg, v);
	}
	return x;
}

/* Takes getopt_long's letter c with its argument v when it is one of
 * BENCH_OPTS_LONGS (true), exiting 2 on a bad value; false for any other. */
static inline bool bench_opts_take(struct bench_opts *o, const char *prog, int c, const char *v)
{
	switch (c) {
	case 'm': o->model = v; return true;
	case 'B': o->batch = bench_int(prog, "batch", v, 1 << 20); return true;
	case 'T': o->seq = bench_int(prog, "seq", v, 1 << 20); return true;
	case 's': o->steps = bench_int(prog, "steps", v, 1000); return true;
	case 'n': o->nvme = v; return true;
	case 'g':
		if (st_parse_size(v, &o->gpu) < 0 || !o->gpu)
			bench_die2(prog, "--gpu-mem is not a size: ", v);
		return true;
	case 'H':
		if (st_parse_size(v, &o->host) < 0 || !o->host)
			bench_die2(prog, "--host-mem is not a size: ", v);
		return true;
	case 'j': o->threads = bench_int(prog, "threads", v, 4096); return true;
	case 'J': o->json = v; return true;
	case 'D':
		if (!st_device_find(v))
			bench_die2(prog, "--device is not built into this binary: ", v);
		o->device = v;
		return true;
	case 'd': o->data = v; return true;
	}
	return false;
}

/* After the options: --nvme must be a directory, --json's directory exist
 * (bench_out_check()), and --model parse into c's train config (as set by
 * st_train_config_default() with B, T). */
static inline void bench_opts_apply(const struct bench_opts *o, const char *prog,
				    struct st_engine_config *c)
{
	struct stat st;

	if (stat(o->nvme, &st) < 0 || !S_ISDIR(st.st_mode))
		bench_die2(prog, "--nvme is not a directory: ", o->nvme);
	if (o->json)
		bench_out_check(prog, "--json", o->json);
	memset(c, 0, sizeof(*c));
	st_train_config_default(&c->train);
	if (st_model_config_parse(o->model, &c->train.model) < 0)
		bench_die2(prog, "bad --model ", o->model);
	c->train.batch = o->batch;
	c->train.seq = o->seq;
	c->train.steps = o->steps + 1;
	c->train.warmup = 1;
	c->device = o->device;
	c->gpu_mem_bytes = o->gpu;
}

struct bench_pair {
	const char *prog;          /* for the messages: "offload-bench" */
	struct st_dataset *ds;
	struct st_loader l[2];
	struct st_engine *e[2];
};

/* Opens data and the engines of c[0] and c[1] (named name[k] in a failure's
 * line); the loaders take B, T and the seed of c[0]. 0, or the exit status
 * (2) after one line on stderr. */
static inline int bench_pair_open(struct bench_pair *p, const char *prog, const char *data,
				  const struct st_engine_config c[2], const char *name[2])
{
	const struct st_loader_config lc = {
		.batch = (uint32_t)c[0].train.batch, .seq = (uint32_t)c[0].train.seq,
		.shuffle = 1, .seed = c[0].train.seed,
	};

	memset(p, 0, sizeof(*p));
	p->prog = prog;
	if (st_dataset_open(&p->ds, data, ST_DATASET_BYTES) < 0) {
		fprintf(stderr, "%s: --data %s: %s\n", prog, data, st_error_last());
		return 2;
	}
	for (int k = 0; k < 2; k++)
		if (st_loader_init(&p->l[k], p->ds, &lc) < 0) {
			fprintf(stderr, "%s: %s\n", prog, st_error_last());
			return 2;
		}
	for (int k = 0; k < 2; k++)
		if (st_engine_create(&c[k], &p->e[k]) < 0) {
			fprintf(stderr, "%s: %s engine: %s\n", prog, name[k], st_error_last());
			return 2;
		}
	return 0;
}

/* Step s of both engines (update: whether it ends in an optimizer step),
 * the first going first on even steps; r[k] is engine k's result. 0, or 1
 * after one line on stderr (a failed step, or results that differ). */
static inline int bench_pair_step(struct bench_pair *p, int s, bool update,
				  struct st_step_result r[2])
{
	for (int i = 0; i < 2; i++) {
		int k = (i == 0) == (s % 2 == 0) ? 0 : 1;

		if (st_engine_step(p->e[k], &p->l[k], s, update, &r[k]) < 0) {
			fprintf(stderr, "%s: step %d: %s\n", p->prog, s, st_error_last());
			return 1;
		}
	}
	if (memcmp(&r[0].loss, &r[1].loss, sizeof(double)) ||
	    memcmp(&r[0].grad_norm, &r[1].grad_norm, sizeof(double))) {
		fprintf(stderr, "%s: step %d: results differ: loss %.9g vs %.9g, gradient norm "
			"%.9g vs %.9g\n", p->prog, s, r[0].loss, r[1].loss, r[0].grad_norm,
			r[1].grad_norm);
		return 1;
	}
	return 0;
}

static inline void bench_pair_close(struct bench_pair *p)
{
	for (int k = 0; k < 2; k++)
		st_engine_destroy(p->e[k]);
	if (p->ds)
		st_dataset_close(p->ds);
	memset(p, 0, sizeof(*p));
}

/* A failure once traces were created: the engines closed (nothing records
 * into t0, t1 any more), then the traces' temporaries removed, so no half
 * trace is left; returns rc, the exit status, for the
 * callers' exit() (their buffers stay reachable, for LeakSanitizer). */
static inline int bench_pair_fail(struct bench_pair *p, int rc, struct st_trace *t0,
				  struct st_trace *t1)
{
	bench_pair_close(p);
	st_trace_abort(t0);
	st_trace_abort(t1);
	return rc;
}

#endif
